"""Operator actions on progress: replay committed ranges, and rewind or skip a position.

Both widen a request to whole committed ranges (a range's contribution is removed exactly or not at
all), report what they will do before doing it, validate everything before anything changes, and
run under the pipeline lock, so they serialize with planning and commits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kafka_batch import batches, committer, offset_store
from kafka_batch.config import Pipeline
from kafka_batch.kafka_source import KafkaOffsets
from kafka_batch.offset_store import Batch, transaction
from kafka_batch.planner import OffsetRange


class OperationError(ValueError):
    """A replay or reset request that cannot be carried out as asked; nothing was changed."""


@dataclass(frozen=True)
class OffsetRequest:
    """Partitions of one topic and an offset span, given as offsets or as timestamps (ms)."""

    topic: str
    partitions: tuple[int, ...] = ()  # empty: every partition the pipeline has read
    from_offset: int | None = None
    until_offset: int | None = None
    from_time_ms: int | None = None
    until_time_ms: int | None = None


def _read_partitions(cur, pipeline: Pipeline, request: OffsetRequest) -> list[int]:
    positions = offset_store.read_positions(cur, pipeline.name)
    known = sorted(p for t, p in positions if t == request.topic)
    if not known:
        topics = sorted({t for t, _ in positions}) or "none yet"
        raise OperationError(f"pipeline {pipeline.name!r} has not read topic {request.topic!r} (it has read: {topics})")
    unknown = sorted(set(request.partitions) - set(known))
    if unknown:
        raise OperationError(f"pipeline {pipeline.name!r} has not read {request.topic} partition(s) {unknown}; known: {known}")
    return list(request.partitions) or known


def _offsets_at(kafka: KafkaOffsets, topic: str, partitions: list[int], time_ms: int) -> dict[int, int]:
    found = kafka.offsets_at_time([(topic, p) for p in partitions], time_ms)
    return {p: found[(topic, p)] for p in partitions}


def _bounds(kafka: KafkaOffsets, request: OffsetRequest, partitions: list[int]) -> dict[int, tuple[int, int]]:
    by_offset = request.from_offset is not None and request.until_offset is not None
    by_time = request.from_time_ms is not None and request.until_time_ms is not None
    if by_offset == by_time:
        raise OperationError("give either from/until offsets or from/until times, not both and not neither")
    if by_offset:
        if request.from_offset < 0 or request.from_offset >= request.until_offset:
            raise OperationError(f"from offset {request.from_offset} must be >= 0 and below until offset {request.until_offset}")
        return {p: (request.from_offset, request.until_offset) for p in partitions}
    if request.from_time_ms >= request.until_time_ms:
        raise OperationError("from time must be before until time")
    starts = _offsets_at(kafka, request.topic, partitions, request.from_time_ms)
    ends = _offsets_at(kafka, request.topic, partitions, request.until_time_ms)
    return {p: (starts[p], ends[p]) for p in partitions}


def _overlapping(cur, pipeline: Pipeline, topic: str, partition: int, lo: int, hi: int) -> list[OffsetRange]:
    """The live committed ranges of a partition that share an offset with [lo, hi)."""
    return [r for r in offset_store.live_ranges(cur, pipeline.name, topic, partition)
            if r.from_offset < hi and r.until_offset > lo]


def ranges_to_replay(cur, kafka: KafkaOffsets, pipeline: Pipeline, request: OffsetRequest) -> list[OffsetRange]:
    """The committed ranges the request overlaps (the request widened to them), checked readable."""
    partitions = _read_partitions(cur, pipeline, request)
    bounds = _bounds(kafka, request, partitions)
    replayed = [r for p in partitions for r in _overlapping(cur, pipeline, request.topic, p, *bounds[p])]
    if not replayed:
        spans = ", ".join(f"[{p}] {lo}..{hi}" for p, (lo, hi) in bounds.items())
        raise OperationError(f"no committed range of {request.topic} overlaps {spans}; nothing to replay")
    log_starts = kafka.offsets([(r.topic, r.partition) for r in replayed])
    for r in replayed:
        log_start = log_starts[(r.topic, r.partition)].log_start
        if r.readable().from_offset < log_start:
            raise OperationError(
                f"range {r} cannot be replayed: the earliest available offset of {r.topic}[{r.partition}] is "
                f"{log_start} (beyond retention)"
            )
    return replayed


def plan_replay(
    conn, kafka: KafkaOffsets, pipeline: Pipeline, request: OffsetRequest, *, run_id: str, requested_by: str,
    reason: str, dag_id: str | None = None,
) -> Batch:
    """Persist a replay batch of the widened ranges; executing it commits or (dry run) previews it."""

    def plan(cur) -> Batch:
        replayed = ranges_to_replay(cur, kafka, pipeline, request)
        return offset_store.insert_replay(cur, pipeline.name, run_id, dag_id, replayed, requested_by, reason)

    return batches.plan_once(conn, pipeline, dag_id, run_id, plan)


def plan_for_interval(
    conn, kafka: KafkaOffsets, pipeline: Pipeline, *, run_id: str, start_ms: int, end_ms: int, dag_id: str | None = None
) -> Batch:
    """The batch of a run planned by time: records before the interval's end, from the stored position.

    Partitions whose position is before the interval's end get a batch up to it. An interval that is
    already behind every position (a backfill of the past) is replayed instead: the committed ranges
    that overlap it are recomputed and swapped, never counted twice.
    """

    def plan(cur) -> Batch:
        states, initial = batches.partition_states(cur, kafka, pipeline)
        offset_store.store_initial_positions(cur, pipeline.name, initial)
        tps = [(s.topic, s.partition) for s in states]
        ends = kafka.offsets_at_time(tps, end_ms)
        behind = [replace(s, last_stable=ends[(s.topic, s.partition)]) for s in states
                  if s.position < ends[(s.topic, s.partition)]]
        if behind:
            return offset_store.insert_batch(cur, pipeline.name, run_id, dag_id, batches.next_ranges(behind, pipeline))
        starts = kafka.offsets_at_time(tps, start_ms)
        replayed = [r for tp in tps for r in _overlapping(cur, pipeline, *tp, starts[tp], ends[tp])]
        if not replayed:
            return offset_store.insert_batch(cur, pipeline.name, run_id, dag_id, [])
        return offset_store.insert_replay(cur, pipeline.name, run_id, dag_id, replayed, f"airflow:{run_id}",
                                          "interval already committed: recomputed")

    return batches.plan_once(conn, pipeline, dag_id, run_id, plan)


def recompute_batch(conn, pipeline: Pipeline, batch: Batch, *, requested_by: str, dag_id: str | None = None) -> Batch:
    """A replay of a committed batch's ranges (a run cleared with `recompute`).

    A replay of this batch not yet committed is resumed, so retrying the task never plans two.
    """
    with transaction(conn) as cur:
        offset_store.lock_pipeline(cur, pipeline.name)
        prefix = f"{batch.run_id}__recompute__"
        cur.execute(
            "SELECT count(*), max(id) FILTER (WHERE status IN ('planned', 'failed')) FROM kafka_batch.batches"
            " WHERE pipeline = %s AND coalesce(dag_id, '') = coalesce(%s, '') AND kind = 'replay'"
            " AND starts_with(run_id, %s)",
            (pipeline.name, dag_id, prefix),
        )
        earlier, pending = cur.fetchone()
        if pending is not None:
            return offset_store.select_batch(cur, "id = %s", (pending,))
        # The live range with the same offsets: the batch's own, or the replay that last recomputed it.
        replayed = [
            live for r in batch.ranges for live in offset_store.live_ranges(cur, pipeline.name, r.topic, r.partition)
            if (live.from_offset, live.until_offset) == (r.from_offset, r.until_offset)
        ]
        if not replayed:
            raise OperationError(f"batch {batch.id} has no committed range left to recompute (rewound since?)")
        return offset_store.insert_replay(
            cur, pipeline.name, f"{prefix}{earlier + 1}", dag_id, replayed, requested_by, f"recompute of batch {batch.id}"
        )


@dataclass(frozen=True)
class Reset:
    topic: str
    partition: int
    position: int
    target: int
    retired: tuple[OffsetRange, ...]
    note: str

    @property
    def direction(self) -> str:
        return "rewind" if self.target < self.position else "skip" if self.target > self.position else "none"

    def __str__(self) -> str:
        what = {"rewind": f"rewind, {len(self.retired)} committed range(s) removed from the totals",
                "skip": f"skip {self.target - self.position} offsets (recorded as skipped)", "none": "no change"}
        return f"{self.topic}[{self.partition}] {self.position} -> {self.target}: {what[self.direction]}{self.note}"


def reset_positions(
    conn, kafka: KafkaOffsets, pipeline: Pipeline, request: OffsetRequest, *, requested_by: str, reason: str,
    dry_run: bool = True,
) -> list[Reset]:
    """Move positions back (removing what the ranges after the target added) or forward (skipping)."""
    if not reason.strip():
        raise OperationError("a reset needs a reason; it is recorded with who asked and when")
    batches.prepare(conn, pipeline)
    with transaction(conn) as cur:
        offset_store.lock_pipeline(cur, pipeline.name)
        partitions = _read_partitions(cur, pipeline, request)
        if (request.from_offset is None) == (request.from_time_ms is None):
            raise OperationError("give the target as an offset or as a time")
        targets = (
            {p: request.from_offset for p in partitions} if request.from_offset is not None
            else _offsets_at(kafka, request.topic, partitions, request.from_time_ms)
        )
        offsets = kafka.offsets([(request.topic, p) for p in partitions])
        positions = offset_store.read_positions(cur, pipeline.name)
        resets = []
        for p in partitions:
            resets.append(_plan_reset(cur, pipeline, request.topic, p, positions[(request.topic, p)], targets[p],
                                      offsets[(request.topic, p)]))
        if dry_run:
            return resets
        for reset in resets:
            _apply_reset(cur, pipeline, reset, requested_by, reason)
        offset_store.supersede_planned(cur, pipeline.name, "superseded by a position reset")
    return resets


def _plan_reset(cur, pipeline: Pipeline, topic: str, partition: int, position: int, target: int, offsets) -> Reset:
    where = f"{topic}[{partition}]"
    if target > offsets.last_stable:
        raise OperationError(f"{where}: target {target} is past the last stable offset {offsets.last_stable}")
    if target >= position:
        return Reset(topic, partition, position, target, (), "")
    after = [r for r in offset_store.live_ranges(cur, pipeline.name, topic, partition) if r.until_offset > target]
    note = ""
    if after and after[0].from_offset < target:
        note = f" (target {target} is inside committed range {after[0]}; widened to its start)"
        target = after[0].from_offset
    if target < offsets.log_start:
        raise OperationError(
            f"{where}: cannot rewind to {target}: the earliest available offset is {offsets.log_start} (beyond retention)"
        )
    return Reset(topic, partition, position, target, tuple(after), note)


def _apply_reset(cur, pipeline: Pipeline, reset: Reset, requested_by: str, reason: str) -> None:
    if reset.direction == "none":
        return
    cur.execute(
        "INSERT INTO kafka_batch.resets (pipeline, topic, partition, from_position, to_position, direction,"
        " ranges_retired, requested_by, reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (pipeline.name, reset.topic, reset.partition, reset.position, reset.target, reset.direction,
         len(reset.retired), requested_by, reason),
    )
    reset_id = cur.fetchone()[0]
    committer.retire_ranges(cur, pipeline, [r.range_id for r in reset.retired], f"reset {reset_id}")
    cur.execute(
        "UPDATE kafka_batch.offsets SET next_offset = %s, updated_at = now(), batch_id = NULL"
        " WHERE pipeline = %s AND topic = %s AND partition = %s AND next_offset = %s",
        (reset.target, pipeline.name, reset.topic, reset.partition, reset.position),
    )
    if cur.rowcount != 1:
        raise OperationError(f"{reset.topic}[{reset.partition}]: the position moved while resetting; nothing changed")
