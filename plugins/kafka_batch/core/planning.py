"""Planning, in one place: which ranges a run reads, persisted before anything is read.

Every kind of plan is here: the next batch by offsets, a batch bounded by a run's data interval
(backfills), a replay of committed ranges, a recompute of a committed batch, and the dry run.
Kafka is asked before the pipeline's lock is taken, so a slow broker never holds up commits; the
lock then serializes planning with commits and resets. The pure decisions live in `ranges`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kafka_batch.config import Pipeline
from kafka_batch.core import batches, database, ledger, positions, registry
from kafka_batch.core.batches import Batch
from kafka_batch.core.database import transaction
from kafka_batch.errors import InputError
from kafka_batch.kafka.publish import published_pending, refuse_unpublishable
from kafka_batch.kafka.ranges import OffsetRange, PartitionState, initial_positions, plan_ranges
from kafka_batch.kafka.source import KafkaOffsets, PartitionOffsets


def prepare(conn, pipeline: Pipeline) -> None:
    """Schema migrations and the pipeline's tables; idempotent, cheap when nothing changes."""
    database.apply_migrations(conn)
    registry.ensure_pipeline(conn, pipeline)


@dataclass(frozen=True)
class LogView:
    """What Kafka said about a pipeline's partitions, asked before any lock is taken."""

    offsets: dict[tuple[str, int], PartitionOffsets]
    start_offsets: dict[tuple[str, int], int]  # where a pipeline started by timestamp begins
    # Where a partition's log stopped holding what was committed below its position (truncations).
    truncated: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def partitions(self) -> list[tuple[str, int]]:
        return list(self.offsets)


def ask_kafka(conn, kafka: KafkaOffsets, pipeline: Pipeline) -> LogView:
    """Partitions, log starts and last stable offsets (and start offsets for a start by time), and where a
    log no longer holds what was committed: asked of a partition's leader only where its leader epoch
    moved since the position was committed (a new leader; only an unclean one truncates)."""
    partitions = kafka.partitions(pipeline.topics, pipeline.topic_pattern)
    offsets = kafka.offsets(partitions)
    with transaction(conn) as cur:
        epochs = positions.read_epochs(cur, pipeline.name)
        started = pipeline.start.kind != "timestamp" or bool(positions.read_positions(cur, pipeline.name))
    moved = {tp: stored for tp, stored in epochs.items()
             if tp in offsets and offsets[tp].epoch is not None and offsets[tp].epoch != stored[1]}
    start_offsets = dict(pipeline.start.offsets)
    if not started:
        start_offsets = kafka.offsets_at_time(partitions, pipeline.start.timestamp_ms)
    return LogView(offsets, start_offsets, kafka.truncations(moved) if moved else {})


def partition_states(cur, pipeline: Pipeline, view: LogView) -> tuple[list[PartitionState], dict]:
    """Each partition's position (where none is stored: where it will begin) and offsets.

    Also returns the initial positions that are not stored yet, for the caller to store or not.
    """
    stored = positions.read_positions(cur, pipeline.name)
    states = [
        PartitionState(t, p, stored.get((t, p)), o.log_start, o.last_stable, o.epoch, view.truncated.get((t, p)))
        for (t, p), o in view.offsets.items()
    ]
    kind = "offsets" if pipeline.start.kind == "timestamp" else pipeline.start.kind
    initial = initial_positions(states, kind, pipeline.new_partitions, view.start_offsets)
    states = [replace(s, position=initial.get((s.topic, s.partition), s.position)) for s in states]
    return states, initial


def next_ranges(states: list[PartitionState], pipeline: Pipeline) -> list[OffsetRange]:
    limits = pipeline.limits
    return plan_ranges(states, limits.max_records_per_partition, limits.max_records_per_batch, pipeline.on_data_loss)


def lag_of(states: list[PartitionState]) -> int:
    """Offsets between the positions and the last stable offsets (an upper bound on unread records)."""
    return sum(max(0, s.last_stable - s.position) for s in states)


def dry_run(conn, kafka: KafkaOffsets, pipeline: Pipeline) -> dict:
    """What the next batch would read, and the lag; nothing is stored (not even initial positions)."""
    database.apply_migrations(conn)
    view = ask_kafka(conn, kafka, pipeline)
    with transaction(conn) as cur:
        states, _ = partition_states(cur, pipeline, view)
    ranges = next_ranges(states, pipeline)
    return {
        "status": "dry_run", "pipeline": pipeline.name,
        "ranges": [{"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset,
                    "until_offset": r.until_offset, "lost_until": r.lost_until} for r in ranges],
        # Offsets, an upper bound on records: markers and compaction leave offsets without records.
        "offsets_planned": sum(r.readable().span for r in ranges),
        "lag": lag_of(states),
    }


def refuse_unauthorized(kafka: KafkaOffsets, pipeline: Pipeline, publish_config: dict | None) -> None:
    """ACLs that would refuse the batch's read (Read on an input topic) or its publish (Write on an output
    topic), found before anything is planned: one line, exit 2."""
    topics = pipeline.topics or sorted({t for t, _ in kafka.partitions((), pipeline.topic_pattern)})
    kafka.refuse_unauthorized(list(topics), ("READ",), "to read the pipeline's input")
    if publish_config is not None:
        refuse_unpublishable(publish_config, pipeline)


def _plan_once(conn, kafka: KafkaOffsets, pipeline: Pipeline, dag_id: str | None, run_id: str,
               ask: Callable[[], object], plan: Callable[[object, object], Batch],
               publish_config: dict | None = None) -> Batch:
    """The batch of a run: the persisted one if the run planned before (a retry), or the pipeline's
    unfinished batch if its output is in Kafka already, else `plan(cur, asked)`.

    `ask` (the Kafka questions) and the ACL checks run outside any transaction and before the pipeline
    is registered, so an unknown topic or a missing grant changes nothing; planning then holds the
    pipeline's lock, so concurrent runs plan one after the other from fresh positions.
    """
    database.apply_migrations(conn)
    with transaction(conn) as cur:
        existing = batches.find_batch(cur, pipeline.name, dag_id, run_id)
    if existing is not None:
        return existing
    asked = ask()
    refuse_unauthorized(kafka, pipeline, publish_config)
    registry.ensure_pipeline(conn, pipeline)
    with transaction(conn) as cur:
        registry.lock_pipeline(cur, pipeline.name)
        existing = batches.find_batch(cur, pipeline.name, dag_id, run_id)
        if existing is None and pipeline.publishing_sinks:
            existing = _published_unfinished(cur, pipeline, publish_config)
        return existing if existing is not None else plan(cur, asked)


def _published_unfinished(cur, pipeline: Pipeline, publish_config: dict | None) -> Batch | None:
    """The pipeline's unfinished batch if its output is in Kafka: such a batch is never superseded (a new
    plan would publish its records again); the run executes it, and its next attempt completes it.

    Asked under the pipeline's lock, which a commit takes before it publishes, and after the sink's
    producers are fenced (`published_pending`), the answer is final. A batch that never published is
    superseded like any other pipeline's, so the next plan applies the definition as it is now: after a
    refused data loss, `on_data_loss: skip` then accepts it. Without the publishing cluster's settings,
    any unfinished batch is taken as published."""
    unfinished = batches.unfinished(cur, pipeline.name)
    if unfinished is None or publish_config is None:
        return unfinished
    inputs = {(r.topic, r.partition) for r in unfinished.ranges}
    return unfinished if published_pending(publish_config, pipeline, {unfinished.id: ""}, inputs) else None


def plan_batch(conn, kafka: KafkaOffsets, pipeline: Pipeline, run_id: str, dag_id: str | None = None,
               publish_config: dict | None = None) -> Batch:
    """The next batch from the stored positions up to the last stable offsets, within the limits
    (`publish_config`: the cluster a Kafka sink publishes on, asked whether an unfinished batch is out)."""

    def plan(cur, view: LogView) -> Batch:
        states, initial = partition_states(cur, pipeline, view)
        positions.store_initial_positions(cur, pipeline.name, initial)
        return batches.insert_batch(cur, pipeline, run_id, dag_id, next_ranges(states, pipeline), lag=lag_of(states))

    return _plan_once(conn, kafka, pipeline, dag_id, run_id, lambda: ask_kafka(conn, kafka, pipeline), plan,
                      publish_config)


def plan_for_interval(
    conn, kafka: KafkaOffsets, pipeline: Pipeline, *, run_id: str, start_ms: int, end_ms: int, dag_id: str | None = None,
    publish_config: dict | None = None,
) -> Batch:
    """The batch of a run planned by time: records before the interval's end, from the stored position.

    Partitions whose position is before the interval's end get a batch up to it. An interval that is
    already behind every position (a backfill of the past) is replayed instead: the committed ranges
    that overlap it are recomputed and swapped, never counted twice.
    """

    def ask():
        view = ask_kafka(conn, kafka, pipeline)
        return view, kafka.offsets_at_time(view.partitions, start_ms), kafka.offsets_at_time(view.partitions, end_ms)

    def plan(cur, asked) -> Batch:
        view, starts, ends = asked
        states, initial = partition_states(cur, pipeline, view)
        positions.store_initial_positions(cur, pipeline.name, initial)
        behind = [replace(s, last_stable=ends[(s.topic, s.partition)]) for s in states
                  if s.position < ends[(s.topic, s.partition)]]
        if behind:
            return batches.insert_batch(cur, pipeline, run_id, dag_id, next_ranges(behind, pipeline), lag=lag_of(states))
        replayed = [r for tp in view.partitions for r in overlapping(cur, pipeline, *tp, starts[tp], ends[tp])]
        if not replayed:
            return batches.insert_batch(cur, pipeline, run_id, dag_id, [], lag=lag_of(states))
        return batches.insert_replay(cur, pipeline, run_id, dag_id, replayed, f"airflow:{run_id}",
                                   "interval already committed: recomputed")

    return _plan_once(conn, kafka, pipeline, dag_id, run_id, ask, plan, publish_config)


# --- replays ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OffsetRequest:
    """Partitions of one topic and an offset span, given as offsets or as timestamps (ms)."""

    topic: str
    partitions: tuple[int, ...] = ()  # empty: every partition the pipeline has read
    from_offset: int | None = None
    until_offset: int | None = None
    from_time_ms: int | None = None
    until_time_ms: int | None = None


def read_partitions(cur, pipeline: Pipeline, request: OffsetRequest) -> list[int]:
    """The request's partitions, all of which the pipeline must have read (empty: all it has read)."""
    stored = positions.read_positions(cur, pipeline.name)
    known = sorted(p for t, p in stored if t == request.topic)
    if not known:
        topics = sorted({t for t, _ in stored}) or "none yet"
        raise InputError(f"pipeline {pipeline.name!r} has not read topic {request.topic!r} (it has read: {topics})")
    unknown = sorted(set(request.partitions) - set(known))
    if unknown:
        raise InputError(f"pipeline {pipeline.name!r} has not read {request.topic} partition(s) {unknown}; known: {known}")
    return list(request.partitions) or known


def offsets_at(kafka: KafkaOffsets, topic: str, partitions: list[int], time_ms: int) -> dict[int, int]:
    found = kafka.offsets_at_time([(topic, p) for p in partitions], time_ms)
    return {p: found[(topic, p)] for p in partitions}


def _bounds(kafka: KafkaOffsets, request: OffsetRequest, partitions: list[int]) -> dict[int, tuple[int, int]]:
    by_offset = request.from_offset is not None and request.until_offset is not None
    by_time = request.from_time_ms is not None and request.until_time_ms is not None
    if by_offset == by_time:
        raise InputError("give either from/until offsets or from/until times, not both and not neither")
    if by_offset:
        if request.from_offset < 0 or request.from_offset >= request.until_offset:
            raise InputError(f"from offset {request.from_offset} must be >= 0 and below until offset {request.until_offset}")
        return {p: (request.from_offset, request.until_offset) for p in partitions}
    if request.from_time_ms >= request.until_time_ms:
        raise InputError("from time must be before until time")
    starts = offsets_at(kafka, request.topic, partitions, request.from_time_ms)
    ends = offsets_at(kafka, request.topic, partitions, request.until_time_ms)
    return {p: (starts[p], ends[p]) for p in partitions}


def overlapping(cur, pipeline: Pipeline, topic: str, partition: int, lo: int, hi: int) -> list[OffsetRange]:
    """The live committed ranges of a partition that share an offset with [lo, hi)."""
    return [r for r in ledger.live_ranges(cur, pipeline.name, topic, partition) if r.from_offset < hi and r.until_offset > lo]


def refuse_folded(cur, pipeline: Pipeline, ranges: list[OffsetRange], what: str) -> None:
    """Ranges beyond the replay horizon cannot leave the outputs one by one any more: refuse them."""
    when = ledger.folded(cur, [r.range_id for r in ranges])
    if when:
        r = next(r for r in ranges if r.range_id in when)
        raise InputError(
            f"{what}: range {r} was folded into the totals on {when[r.range_id]:%Y-%m-%d %H:%M} UTC, beyond the"
            f" replay horizon (replayable: {pipeline.replayable}); it can no longer be replayed or rewound range by"
            " range. Choose newer offsets, or widen `replayable` (for ranges committed from now on)"
        )


def ranges_to_replay(cur, kafka: KafkaOffsets, pipeline: Pipeline, request: OffsetRequest) -> list[OffsetRange]:
    """The committed ranges the request overlaps (the request widened to them), checked readable."""
    partitions = read_partitions(cur, pipeline, request)
    bounds = _bounds(kafka, request, partitions)
    replayed = [r for p in partitions for r in overlapping(cur, pipeline, request.topic, p, *bounds[p])]
    if not replayed:
        spans = ", ".join(f"[{p}] {lo}..{hi}" for p, (lo, hi) in bounds.items())
        raise InputError(f"no committed range of {request.topic} overlaps {spans}; nothing to replay")
    refuse_folded(cur, pipeline, replayed, "replay")
    log_starts = kafka.log_starts([(r.topic, r.partition) for r in replayed])
    for r in replayed:
        log_start = log_starts[(r.topic, r.partition)]
        if r.readable().from_offset < log_start:
            raise InputError(
                f"range {r} cannot be replayed: the earliest available offset of {r.topic}[{r.partition}] is "
                f"{log_start} (beyond retention)"
            )
    return replayed


def plan_replay(
    conn, kafka: KafkaOffsets, pipeline: Pipeline, request: OffsetRequest, *, run_id: str, requested_by: str,
    reason: str, dag_id: str | None = None,
) -> Batch:
    """Persist a replay of the widened ranges, with the definition in force now (that is its purpose)."""

    def plan(cur, _asked) -> Batch:
        replayed = ranges_to_replay(cur, kafka, pipeline, request)
        return batches.insert_replay(cur, pipeline, run_id, dag_id, replayed, requested_by, reason)

    return _plan_once(conn, kafka, pipeline, dag_id, run_id, lambda: None, plan)


def recompute_batch(conn, pipeline: Pipeline, batch: Batch, *, requested_by: str, dag_id: str | None = None) -> Batch:
    """A replay of a committed batch's ranges (a run cleared with `recompute`).

    A replay of this batch not yet committed is resumed, so retrying the task never plans two.
    """
    with transaction(conn) as cur:
        registry.lock_pipeline(cur, pipeline.name)
        prefix = f"{batch.run_id}__recompute__"
        earlier, pending = batches.pending_recompute(cur, pipeline.name, dag_id, prefix)
        if pending is not None:
            return batches.select_batch(cur, pending)
        # The live range with the same offsets: the batch's own, or the replay that last recomputed it.
        replayed = [
            live for r in batch.ranges for live in ledger.live_ranges(cur, pipeline.name, r.topic, r.partition)
            if (live.from_offset, live.until_offset) == (r.from_offset, r.until_offset)
        ]
        if not replayed:
            raise InputError(f"batch {batch.id} has no committed range left to recompute (rewound since?)")
        refuse_folded(cur, pipeline, replayed, f"recompute of batch {batch.id}")
        return batches.insert_replay(
            cur, pipeline, f"{prefix}{earlier + 1}", dag_id, replayed, requested_by, f"recompute of batch {batch.id}"
        )
