"""Everything the console page shows, and nothing else: read-only queries over the bookkeeping.

Every query runs in a READ ONLY transaction, so Postgres itself refuses a write from here; no
migration is run (a database the pipelines have not migrated yet is reported, not changed). Kafka
is asked for offsets and for the timestamp of the oldest unread record only. The page's actions are
Airflow's (trigger the replay DAG) or the CLI's: nothing here changes progress.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from kafka_batch.config import Pipeline
from kafka_batch.core import database, positions
from kafka_batch.core.planning import ask_kafka, partition_states
from kafka_batch.errors import MissingTopic, StateError
from kafka_batch.kafka.source import KafkaOffsets, first_timestamps


@contextmanager
def reading(conn) -> Iterator:
    """A read-only transaction (Postgres refuses writes in it), rolled back at the end."""
    conn.set_session(readonly=True)
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.rollback()


def check_schema(conn) -> None:
    """Refuse to read a database the pipelines have not migrated (yet) to this version's schema."""
    if database.pending_migrations(conn):
        raise StateError("the kafka_batch schema is not migrated to this version yet; the next batch migrates it")


def _rows(cur, statement: str, params: tuple) -> list[dict]:
    cur.execute(statement, params)
    names = [column.name for column in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def partitions(conn, kafka: KafkaOffsets, kafka_config: dict, pipeline: Pipeline,
               timeout: float = 5.0, oldest_unread: bool = True) -> list[dict]:
    """Per partition: position, log start, last stable offset, lag and the oldest unread record's time
    (None without `oldest_unread`: it costs a fetch per partition behind).

    A partition without a stored position shows where it will begin (`stored` false).
    """
    view = ask_kafka(conn, kafka, pipeline)
    with reading(conn) as cur:
        stored = positions.read_positions(cur, pipeline.name)
        states, _ = partition_states(cur, pipeline, view)
        cur.execute("SELECT topic, partition, batch_id, updated_at FROM kafka_batch.offsets WHERE pipeline = %s",
                    (pipeline.name,))
        moved = {(t, p): (b, u) for t, p, b, u in cur.fetchall()}
    lagging = {(s.topic, s.partition): s.position for s in states if s.last_stable > s.position}
    oldest = first_timestamps(kafka_config, lagging, timeout=timeout) if oldest_unread else {}
    result = []
    for s in states:
        tp = (s.topic, s.partition)
        ts = oldest.get(tp)
        batch_id, updated_at = moved.get(tp, (None, None))
        result.append({
            "topic": s.topic, "partition": s.partition, "position": s.position, "stored": tp in stored,
            "log_start": s.log_start, "last_stable": s.last_stable, "lag": max(0, s.last_stable - s.position),
            "oldest_unread_at": None if ts is None else datetime.fromtimestamp(ts / 1000, UTC),
            "last_batch_id": batch_id, "updated_at": updated_at,
        })
    return result


def sharing_connections(pipelines: Iterable[Pipeline]) -> list[list[Pipeline]]:
    """The pipelines grouped by their Postgres and Kafka connections: each group is one `overview`."""
    groups: dict[tuple[str, str], list[Pipeline]] = {}
    for pipeline in pipelines:
        groups.setdefault((pipeline.connections.postgres, pipeline.connections.kafka), []).append(pipeline)
    return list(groups.values())


def overview(conn, kafka: KafkaOffsets, kafka_config: dict, pipelines: list[Pipeline], timeout: float = 5.0,
             oldest_unread: bool = True) -> list[dict]:
    """A line per pipeline, for pipelines that share this Postgres and this Kafka: its bookkeeping
    (`summary`) and its partitions behind (`behind`), with `error` (Postgres) or `kafka_error` (the
    exception) instead where they failed, the others' lines unharmed. A pipeline that never ran and
    whose topic does not exist yet is `not_started` (why), not an error: a sample no one has run.

    The oldest unread record of every pipeline's partitions behind is asked in one fetch for them all
    (without `oldest_unread`: only where a pipeline's alerts bound its age). One consumer per pipeline
    made the console's overview of 200 pipelines take a minute.
    """
    kafka = _AskedOnce(kafka, pipelines)
    lines = []
    for pipeline in pipelines:
        line: dict = {"pipeline": pipeline, "error": None, "kafka_error": None, "not_started": None, "parts": None}
        try:
            line.update(summary(conn, pipeline.name))
            try:
                line["parts"] = partitions(conn, kafka, kafka_config, pipeline, timeout, oldest_unread=False)
            except MissingTopic as exc:
                if line["last_batch"] is None:
                    line["not_started"] = f"not started: {exc}"
                else:
                    line["kafka_error"] = exc
            except Exception as exc:  # Kafka's answer (the bookkeeping above is still worth showing)
                line["kafka_error"] = exc
        except Exception as exc:
            line["error"] = exc
        lines.append(line)
    asked = [line for line in lines if line["parts"]
             and (oldest_unread or line["pipeline"].alerts.max_lag_seconds is not None)]
    oldest = _oldest_unread(kafka_config, [p for line in asked for p in line["parts"] if p["lag"]], timeout)
    now = datetime.now(UTC)
    for line in lines:
        parts = line.pop("parts")
        if parts is not None:
            for p in parts:
                p["oldest_unread_at"] = oldest.get((p["topic"], p["partition"], p["position"]))
            line.update(behind(line["pipeline"], parts, now))
    return lines


class _AskedOnce:
    """The Kafka answers of one overview: each topic's partitions asked once, and the offsets of every
    pipeline's partitions in one listing, instead of three requests per pipeline (200 pipelines over 20
    topics ask 20 metadata requests and one listing). A pipeline whose topics fail is asked again alone,
    so its error is its own."""

    def __init__(self, kafka: KafkaOffsets, pipelines: list[Pipeline]):
        self._kafka = kafka
        self._partitions: dict[tuple, list[tuple[str, int]]] = {}
        self._offsets: dict = {}
        wanted = set()
        for pipeline in pipelines:
            try:
                wanted.update(self.partitions(pipeline.topics, pipeline.topic_pattern))
            except Exception:  # noqa: BLE001 - the pipeline's own line says it (asked again there)
                continue
        try:
            self._offsets = kafka.offsets(sorted(wanted))
        except Exception:  # noqa: BLE001 - each pipeline asks alone, and its line says what failed
            self._offsets = {}

    def partitions(self, topics: tuple[str, ...], pattern: str | None = None) -> list[tuple[str, int]]:
        key = (tuple(topics), pattern)
        if key not in self._partitions:
            self._partitions[key] = self._kafka.partitions(topics, pattern)
        return self._partitions[key]

    def offsets(self, partitions: list[tuple[str, int]]):
        missing = [tp for tp in partitions if tp not in self._offsets]
        if missing:
            self._offsets.update(self._kafka.offsets(missing))
        return {tp: self._offsets[tp] for tp in partitions}

    def offsets_at_time(self, partitions: list[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int]:
        return self._kafka.offsets_at_time(partitions, timestamp_ms)


def _oldest_unread(kafka_config: dict, parts: list[dict], timeout: float) -> dict[tuple[str, int, int], datetime]:
    """The first committed record's time at each (topic, partition, position), in as few fetches as the
    positions allow (pipelines reading one partition from two positions need two)."""
    rounds: list[dict[tuple[str, int], int]] = []
    for p in parts:
        tp = (p["topic"], p["partition"])
        free = next((r for r in rounds if r.get(tp, p["position"]) == p["position"]), None)
        if free is None:
            rounds.append(free := {})
        free[tp] = p["position"]
    found = {}
    for positions_ in rounds:
        for (topic, partition), ts in first_timestamps(kafka_config, positions_, timeout=timeout).items():
            if ts is not None:
                found[topic, partition, positions_[topic, partition]] = datetime.fromtimestamp(ts / 1000, UTC)
    return found


def behind(pipeline: Pipeline, parts: list[dict], now: datetime) -> dict:
    """An overview's line for a pipeline's partitions (`partitions`' rows): how many, the lag, how many
    are behind, the oldest unread record and what is over the pipeline's alerts."""
    times = [p["oldest_unread_at"] for p in parts if p["oldest_unread_at"] is not None]
    lag = sum(p["lag"] for p in parts)
    oldest = min(times) if times else None
    return {"partitions": len(parts), "lag": lag, "partitions_behind": sum(1 for p in parts if p["lag"]),
            "oldest_unread_at": oldest, "behind": pipeline.alerts.breaches(lag, oldest, now)}


def summary(conn, pipeline_name: str) -> dict:
    """The overview's bookkeeping of one pipeline: its last batch, last commit and what needs a look."""
    with reading(conn) as cur:
        last = _rows(cur, "SELECT id, kind, status, dag_id, run_id, planned_at, committed_at FROM kafka_batch.batches"
                          " WHERE pipeline = %s ORDER BY id DESC LIMIT 1", (pipeline_name,))
        cur.execute(
            "SELECT (SELECT max(committed_at) FROM kafka_batch.batches WHERE pipeline = %(p)s),"
            " (SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %(p)s AND status = 'failed'),"
            " (SELECT count(*) FROM kafka_batch.data_loss WHERE pipeline = %(p)s),"
            " (SELECT count(*) FROM kafka_batch.resets WHERE pipeline = %(p)s),"
            " (SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %(p)s)",
            {"p": pipeline_name},
        )
        committed_at, failed, lost, resets, quarantined = cur.fetchone()
    return {"last_batch": last[0] if last else None, "last_commit_at": committed_at, "failed_batches": failed,
            "data_loss": lost, "resets": resets, "quarantined": quarantined}


def batches(conn, pipeline_name: str, limit: int = 20) -> list[dict]:
    """The newest batches with their ranges, counts and duration (planned or started to committed)."""
    with reading(conn) as cur:
        return _rows(cur, """
            SELECT b.id, b.kind, b.dag_id, b.run_id, b.try_number, b.status, b.planned_at, b.started_at,
                   b.committed_at, b.records_read, b.records_invalid, b.error, b.lag_at_plan,
                   extract(epoch FROM b.committed_at - coalesce(b.started_at, b.planned_at))::float AS duration_s,
                   coalesce(json_agg(json_build_object('topic', r.topic, 'partition', r.partition,
                       'from_offset', r.from_offset, 'until_offset', r.until_offset, 'records_read', r.records_read)
                       ORDER BY r.topic, r.partition, r.from_offset) FILTER (WHERE r.id IS NOT NULL), '[]') AS ranges
            FROM kafka_batch.batches b LEFT JOIN kafka_batch.batch_ranges r ON r.batch_id = b.id
            WHERE b.pipeline = %s GROUP BY b.id ORDER BY b.id DESC LIMIT %s""", (pipeline_name, limit))


def batch_ranges(conn, batch_id: int) -> list[dict]:
    """One batch's ranges with what was read from each (the CLI's summary table)."""
    with reading(conn) as cur:
        return _rows(cur, """
            SELECT topic, partition, from_offset, until_offset, records_read, records_tombstone, records_invalid
            FROM kafka_batch.batch_ranges WHERE batch_id = %s ORDER BY topic, partition, from_offset""", (batch_id,))


def ledger(conn, pipeline_name: str, topic: str, partition: int, limit: int = 100) -> list[dict]:
    """The committed ranges of one partition, live and retired, newest offsets first."""
    with reading(conn) as cur:
        return _rows(cur, """
            SELECT range_id, from_offset, until_offset, lost_until, records_read, records_tombstone, batch_id, kind,
                   dag_id, run_id, try_number, committed_at, definition_hash, replaces_range_id, retired_at,
                   retired_by, schema_ids, CASE WHEN retired_at IS NULL THEN 'live' ELSE 'retired' END AS state
            FROM kafka_batch.ledger WHERE pipeline = %s AND topic = %s AND partition = %s
            ORDER BY from_offset DESC, range_id DESC LIMIT %s""", (pipeline_name, topic, partition, limit))


def history(conn, pipeline_name: str, limit: int = 100) -> list[dict]:
    """Per committed batch, oldest first: records read (from the ledger) and the lag when it was planned."""
    with reading(conn) as cur:
        rows = _rows(cur, """
            SELECT l.batch_id, l.kind, min(l.committed_at) AS committed_at, sum(l.records_read)::bigint AS records_read,
                   min(b.lag_at_plan) AS lag_at_plan
            FROM kafka_batch.ledger l JOIN kafka_batch.batches b ON b.id = l.batch_id
            WHERE l.pipeline = %s GROUP BY l.batch_id, l.kind ORDER BY l.batch_id DESC LIMIT %s""",
                     (pipeline_name, limit))
    return rows[::-1]


def data_loss(conn, pipeline_name: str, limit: int = 100) -> list[dict]:
    with reading(conn) as cur:
        return _rows(cur, "SELECT id, topic, partition, lost_from, lost_until, detected_at, recorded_at, batch_id"
                          " FROM kafka_batch.data_loss WHERE pipeline = %s ORDER BY id DESC LIMIT %s",
                     (pipeline_name, limit))


def resets(conn, pipeline_name: str, limit: int = 100) -> list[dict]:
    with reading(conn) as cur:
        return _rows(cur, "SELECT id, topic, partition, from_position, to_position, direction, ranges_retired,"
                          " requested_by, reason, reset_at FROM kafka_batch.resets WHERE pipeline = %s"
                          " ORDER BY id DESC LIMIT %s", (pipeline_name, limit))


def replay_previews(conn, pipeline_name: str, limit: int = 100) -> list[dict]:
    """The newest previewed replays' per-key changes (before -> after), as the dry runs stored them."""
    with reading(conn) as cur:
        return _rows(cur, """
            SELECT p.batch_id, b.run_id, b.requested_by, b.reason, p.target AS "table", p.group_key, p.before, p.after
            FROM kafka_batch.replay_previews p JOIN kafka_batch.batches b ON b.id = p.batch_id
            WHERE b.pipeline = %s ORDER BY p.batch_id DESC, p.target, p.group_key::text LIMIT %s""",
                     (pipeline_name, limit))
