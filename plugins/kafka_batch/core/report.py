"""What operators and the DAG's report step see: positions, lag, and a batch's counts.

Read-only: nothing here changes progress.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from kafka_batch.config import Pipeline
from kafka_batch.core import batches, database
from kafka_batch.core.database import transaction
from kafka_batch.core.planning import ask_kafka, partition_states
from kafka_batch.core.state import BatchStatus
from kafka_batch.errors import ServiceError
from kafka_batch.kafka.source import KafkaOffsets

log = logging.getLogger("kafka_batch.report")


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    position: int
    log_start: int
    last_stable: int
    lag: int
    last_batch_id: int | None


@dataclass(frozen=True)
class TopicStatus:
    """A topic's partitions summed up, for pipelines of many: how far behind, and where most."""

    topic: str
    partitions: int
    lag: int
    behind: int  # partitions with a lag
    worst: tuple[tuple[int, int], ...]  # (partition, lag) of the most behind, most first
    last_batch_id: int | None


def topic_totals(rows: Iterable[tuple[str, int, int, int | None]], worst: int = 3) -> list[TopicStatus]:
    """Per topic, in the rows' order, from (topic, partition, lag, last batch) per partition: partitions,
    lag, how many are behind and the `worst` most behind."""
    by_topic: dict[str, list[tuple[str, int, int, int | None]]] = {}
    for row in rows:
        by_topic.setdefault(row[0], []).append(row)
    return [TopicStatus(
        topic, len(found), sum(lag for _, _, lag, _ in found), sum(1 for _, _, lag, _ in found if lag),
        tuple((p, lag) for _, p, lag, _ in sorted((r for r in found if r[2]), key=lambda r: -r[2])[:worst]),
        max((b for *_, b in found if b is not None), default=None),
    ) for topic, found in by_topic.items()]


def status(conn, kafka: KafkaOffsets, pipeline: Pipeline) -> list[PartitionStatus]:
    """Per partition: committed position, last stable offset, lag and the batch that last moved it."""
    database.apply_migrations(conn)
    view = ask_kafka(conn, kafka, pipeline)
    with transaction(conn) as cur:
        states, _ = partition_states(cur, pipeline, view)
        cur.execute("SELECT topic, partition, batch_id FROM kafka_batch.offsets WHERE pipeline = %s", (pipeline.name,))
        last_batch = {(t, p): b for t, p, b in cur.fetchall()}
    return [
        PartitionStatus(s.topic, s.partition, s.position, s.log_start, s.last_stable,
                        max(0, s.last_stable - s.position), last_batch.get((s.topic, s.partition)))
        for s in states
    ]


def report(conn, kafka: KafkaOffsets, pipeline: Pipeline, batch_id: int) -> dict:
    """A summary for logs and XCom: the batch's counts and per-partition lag; no connection details. The
    batch is what Postgres says: a cluster that does not answer leaves the lag unknown (`lag_error` says
    why), it does not fail a batch that committed."""
    batch = batches.load_batch(conn, batch_id)
    try:
        partitions = [asdict(s) for s in status(conn, kafka, pipeline)]
    except ServiceError as exc:
        log.warning("batch %s: the lag is unknown: %s", batch_id, exc)
        return {**batch.summary(), "lag": None, "partitions": [], "lag_error": str(exc)}
    result = {**batch.summary(), "lag": sum(p["lag"] for p in partitions), "partitions": partitions}
    if batch.status == BatchStatus.PREVIEWED:
        result["preview"] = batches.replay_preview(conn, batch_id)
    return result


def sentence(result: dict) -> str:
    """`report`'s result as one line a person reads: what the batch did, then the lag."""
    kind, number, state = result["kind"], result["batch_id"], result["status"]
    if state == BatchStatus.EMPTY:
        did = f"{kind} {number} was empty: no new records to read"
    elif result.get("records_read") is None:
        did = f"{kind} {number} is {state}: nothing read yet"
    else:
        invalid = result.get("records_invalid") or 0
        did = f"{kind} {number} is {state}: {result['records_read']:,} records read" + (
            f", {invalid:,} quarantined" if invalid else "")
    lag = f"{result['lag']:,}" if result.get("lag") is not None else f"unknown ({result.get('lag_error')})"
    return f"{did}; lag now {lag}"


def batch_facts(conn, batch_id: int) -> dict:
    """What the ledger says of one batch, for its metrics (kafka_batch.observability.metrics.batch_points): counts,
    attempts, phases' seconds, what it published per topic and the offsets it recorded as lost, per partition."""
    with transaction(conn) as cur:
        cur.execute(
            "SELECT pipeline, kind, status, attempt, records_read, records_tombstone, records_invalid, read_seconds,"
            " commit_seconds, extract(epoch FROM committed_at - started_at)::float, published"
            " FROM kafka_batch.batches WHERE id = %s", (batch_id,))
        row = cur.fetchone()
        cur.execute("SELECT topic, partition, sum(lost_until - lost_from) FROM kafka_batch.data_loss"
                    " WHERE batch_id = %s GROUP BY topic, partition", (batch_id,))
        lost = {(t, p): int(n) for t, p, n in cur.fetchall()}
    names = ("pipeline", "kind", "status", "attempt", "records_read", "records_tombstone", "records_invalid",
             "read_seconds", "commit_seconds", "execute_seconds", "published")
    facts = dict(zip(names, row, strict=True))
    return {**facts, "published": facts["published"] or {}, "offsets_lost": lost}


def batch_lineage(conn, batch_id: int, tables: tuple[str, ...]) -> tuple[batches.Batch, dict[str, int], dict]:
    """What lineage says of a batch: the batch (its kind, attempt and exact ranges), the rows it changed
    per table when it committed, and each output table's columns [(name, type)] as Postgres has them."""
    batch = batches.load_batch(conn, batch_id)
    with transaction(conn) as cur:
        cur.execute("SELECT rows_written FROM kafka_batch.batches WHERE id = %s", (batch_id,))
        rows = cur.fetchone()[0] or {}
    return batch, rows, table_columns(conn, tables)


def table_columns(conn, tables: tuple[str, ...]) -> dict[str, list[tuple[str, str]]]:
    """Each public table's columns [(name, type)], as Postgres has them."""
    with transaction(conn) as cur:
        cur.execute("SELECT table_name, column_name, data_type FROM information_schema.columns"
                    " WHERE table_schema = 'public' AND table_name = ANY(%s) ORDER BY table_name, ordinal_position",
                    (list(tables),))
        columns: dict[str, list[tuple[str, str]]] = {}
        for table, column, kind in cur.fetchall():
            columns.setdefault(table, []).append((column, kind))
    return columns
