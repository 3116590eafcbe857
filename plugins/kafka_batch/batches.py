"""Batch lifecycle around the Spark job: plan (persist the ranges) and report (lag, counts).

The same functions serve the DAG tasks, the CLI and the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from kafka_batch import offset_store
from kafka_batch.config import ConfigError, Limits, Pipeline
from kafka_batch.kafka_source import KafkaOffsets
from kafka_batch.offset_store import Batch, transaction
from kafka_batch.planner import OffsetRange, PartitionState, initial_positions, plan_ranges


def prepare(conn, pipeline: Pipeline) -> None:
    """Schema migrations and the pipeline's tables; idempotent, cheap when nothing changes."""
    offset_store.apply_migrations(conn)
    offset_store.ensure_pipeline(conn, pipeline)


def partition_states(cur, kafka: KafkaOffsets, pipeline: Pipeline) -> tuple[list[PartitionState], dict]:
    """Each partition's position (where none is stored, where it will begin) and offsets.

    Also returns the initial positions that are not stored yet, for the caller to store or not.
    """
    positions = offset_store.read_positions(cur, pipeline.name)
    partitions = kafka.partitions(pipeline.topics, pipeline.topic_pattern)
    offsets = kafka.offsets(partitions)
    states = [
        PartitionState(t, p, positions.get((t, p)), offsets[(t, p)].log_start, offsets[(t, p)].last_stable)
        for t, p in partitions
    ]
    start = pipeline.start
    kind, start_offsets = start.kind, start.offsets
    if kind == "timestamp" and not positions:
        kind, start_offsets = "offsets", kafka.offsets_at_time([(s.topic, s.partition) for s in states], start.timestamp_ms)
    initial = initial_positions(states, kind, pipeline.new_partitions, start_offsets)
    states = [replace(s, position=initial.get((s.topic, s.partition), s.position)) for s in states]
    return states, initial


def next_ranges(states: list[PartitionState], pipeline: Pipeline) -> list[OffsetRange]:
    limits = pipeline.limits
    return plan_ranges(states, limits.max_records_per_partition, limits.max_records_per_batch, pipeline.on_data_loss)


def with_limits(pipeline: Pipeline, **overrides: int | None) -> Pipeline:
    """The pipeline with some limits changed for one run (a triggered run's params)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    for key, value in given.items():
        if key not in Limits.__dataclass_fields__:
            raise ConfigError(f"unknown limit {key!r}; known: {sorted(Limits.__dataclass_fields__)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"limit {key} must be a positive integer, got {value!r}")
    return replace(pipeline, limits=replace(pipeline.limits, **given)) if given else pipeline


def dry_run(conn, kafka: KafkaOffsets, pipeline: Pipeline) -> dict:
    """What the next batch would read, and the lag; nothing is stored (not even initial positions)."""
    prepare(conn, pipeline)
    with transaction(conn) as cur:
        states, _ = partition_states(cur, kafka, pipeline)
        ranges = next_ranges(states, pipeline)
        conn.rollback()
    return {
        "status": "dry_run", "pipeline": pipeline.name,
        "ranges": [{"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset,
                    "until_offset": r.until_offset, "lost_until": r.lost_until} for r in ranges],
        # Offsets, an upper bound on records: markers and compaction leave offsets without records.
        "offsets_planned": sum(r.readable().span for r in ranges),
        "lag": sum(max(0, s.last_stable - s.position) for s in states),
    }


def plan_once(conn, pipeline: Pipeline, dag_id: str | None, run_id: str, plan: Callable[[object], Batch]) -> Batch:
    """The batch of a run: the persisted one if the run planned before (a retry), else `plan(cur)`.

    Planning holds the pipeline's lock, so concurrent runs plan one after the other from fresh positions.
    """
    prepare(conn, pipeline)
    with transaction(conn) as cur:
        offset_store.lock_pipeline(cur, pipeline.name)
        existing = offset_store.find_batch(cur, pipeline.name, dag_id, run_id)
        return existing if existing is not None else plan(cur)


def plan_batch(conn, kafka: KafkaOffsets, pipeline: Pipeline, run_id: str, dag_id: str | None = None) -> Batch:
    """The next batch from the stored positions up to the last stable offsets, within the limits."""

    def plan(cur) -> Batch:
        states, initial = partition_states(cur, kafka, pipeline)
        offset_store.store_initial_positions(cur, pipeline.name, initial)
        return offset_store.insert_batch(cur, pipeline.name, run_id, dag_id, next_ranges(states, pipeline))

    return plan_once(conn, pipeline, dag_id, run_id, plan)


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    position: int
    log_start: int
    last_stable: int
    lag: int
    last_batch_id: int | None


def status(conn, kafka: KafkaOffsets, pipeline: Pipeline) -> list[PartitionStatus]:
    """Per partition: committed position, last stable offset, lag and the batch that last moved it."""
    prepare(conn, pipeline)
    with transaction(conn) as cur:
        states, _ = partition_states(cur, kafka, pipeline)
        cur.execute("SELECT topic, partition, batch_id FROM kafka_batch.offsets WHERE pipeline = %s", (pipeline.name,))
        last_batch = {(t, p): b for t, p, b in cur.fetchall()}
    return [
        PartitionStatus(s.topic, s.partition, s.position, s.log_start, s.last_stable,
                        max(0, s.last_stable - s.position), last_batch.get((s.topic, s.partition)))
        for s in states
    ]


def report(conn, kafka: KafkaOffsets, pipeline: Pipeline, batch_id: int) -> dict:
    """A summary for logs and XCom: the batch's counts and per-partition lag; no connection details."""
    batch = offset_store.load_batch(conn, batch_id)
    partitions = [asdict(s) for s in status(conn, kafka, pipeline)]
    result = {**batch.summary(), "lag": sum(p["lag"] for p in partitions), "partitions": partitions}
    if batch.status == "previewed":
        result["preview"] = offset_store.replay_preview(conn, batch_id)
    return result


def format_status(rows: list[PartitionStatus]) -> str:
    header = f"{'topic':<24} {'part':>4} {'position':>12} {'last_stable':>12} {'lag':>10} {'last_batch':>10}"
    lines = [header]
    for r in rows:
        last = "-" if r.last_batch_id is None else str(r.last_batch_id)
        lines.append(f"{r.topic:<24} {r.partition:>4} {r.position:>12} {r.last_stable:>12} {r.lag:>10} {last:>10}")
    return "\n".join(lines)
