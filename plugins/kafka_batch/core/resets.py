"""Rewind or skip a position: an operator's deliberate move, recorded with who, when and why.

A rewind is widened to whole committed ranges (a range's effect is removed exactly or not at all)
and takes the ranges after the target out of every sink; a skip moves past offsets without reading
them. Both report what they will do before doing it (dry run), validate everything before anything
changes, and run under the pipeline lock, so they serialize with planning and commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kafka_batch.config import Pipeline
from kafka_batch.core import batches, ledger, positions, registry
from kafka_batch.core.commit import retire_ranges
from kafka_batch.core.database import transaction
from kafka_batch.core.planning import OffsetRequest, offsets_at, prepare, read_partitions, refuse_folded
from kafka_batch.errors import InputError, StateError
from kafka_batch.kafka.publish import published_pending
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.kafka.source import KafkaOffsets


@dataclass(frozen=True)
class Reset:
    topic: str
    partition: int
    position: int
    target: int
    retired: tuple[OffsetRange, ...]
    note: str
    rows_changed: dict[str, int] = field(default_factory=dict)  # per output table, once applied

    @property
    def direction(self) -> str:
        return "rewind" if self.target < self.position else "skip" if self.target > self.position else "none"

    def __str__(self) -> str:
        what = {"rewind": f"rewind, {len(self.retired)} committed range(s) removed from the outputs",
                "skip": f"skip {self.target - self.position} offsets (recorded as skipped)", "none": "no change"}
        return f"{self.topic}[{self.partition}] {self.position} -> {self.target}: {what[self.direction]}{self.note}"


def reset_positions(
    conn, kafka: KafkaOffsets, pipeline: Pipeline, request: OffsetRequest, *, requested_by: str, reason: str,
    dry_run: bool = True, kafka_config: dict | None = None,
) -> list[Reset]:
    """Move positions back (removing what the ranges after the target added) or forward (skipping).
    A pipeline that publishes to Kafka (on `kafka_config`) refuses while a batch of it is published and
    not committed in Postgres (`_refuse_published`)."""
    if not reason.strip():
        raise InputError("a reset needs a reason; it is recorded with who asked and when")
    prepare(conn, pipeline)
    with transaction(conn) as cur:
        registry.lock_pipeline(cur, pipeline.name)
        partitions = read_partitions(cur, pipeline, request)
        if (request.from_offset is None) == (request.from_time_ms is None):
            raise InputError("give the target as an offset or as a time")
        targets = (
            {p: request.from_offset for p in partitions} if request.from_offset is not None
            else offsets_at(kafka, request.topic, partitions, request.from_time_ms)
        )
        offsets = kafka.offsets([(request.topic, p) for p in partitions])
        stored = positions.read_positions(cur, pipeline.name)
        resets = []
        for p in partitions:
            resets.append(_plan_reset(cur, pipeline, request.topic, p, stored[(request.topic, p)], targets[p],
                                      offsets[(request.topic, p)]))
        if dry_run:
            return resets
        _refuse_published(cur, pipeline, kafka_config, stored)
        resets = [_apply_reset(cur, pipeline, reset, requested_by, reason) for reset in resets]
        batches.supersede_planned(cur, pipeline.name, "superseded by a position reset")
    return resets


def _refuse_published(cur, pipeline: Pipeline, kafka_config: dict | None, inputs) -> None:
    """A reset supersedes the unfinished batches; one whose output is in Kafka already must complete first
    (superseded, its records would be published again by the batch that reads them next)."""
    pending = batches.may_commit(cur, pipeline.name) if pipeline.publishing_sinks else {}
    if not pending:
        return
    if kafka_config is None:
        raise StateError(f"pipeline {pipeline.name!r} publishes to Kafka: a reset needs its Kafka connection")
    published = published_pending(kafka_config, pipeline, pending, inputs)
    if published:
        batch_id, topic = min(published.items())
        raise InputError(
            f"pipeline {pipeline.name!r}: batch {batch_id} ({pending[batch_id]}) is published to topic {topic!r} and"
            " not yet committed in Postgres; run the pipeline once (its next attempt completes the batch without"
            " publishing again), then reset; nothing was changed")


def _plan_reset(cur, pipeline: Pipeline, topic: str, partition: int, position: int, target: int, offsets) -> Reset:
    where = f"{topic}[{partition}]"
    if target > offsets.last_stable:
        raise InputError(f"{where}: target {target} is past the last stable offset {offsets.last_stable}")
    if target >= position:
        return Reset(topic, partition, position, target, (), "")
    after = [r for r in ledger.live_ranges(cur, pipeline.name, topic, partition) if r.until_offset > target]
    note = ""
    if after and after[0].from_offset < target:
        note = f" (target {target} is inside committed range {after[0]}; widened to its start)"
        target = after[0].from_offset
    if target < offsets.log_start:
        raise InputError(
            f"{where}: cannot rewind to {target}: the earliest available offset is {offsets.log_start} (beyond retention)"
        )
    refuse_folded(cur, pipeline, after, f"rewind of {where} to {target}")
    return Reset(topic, partition, position, target, tuple(after), note)


def _apply_reset(cur, pipeline: Pipeline, reset: Reset, requested_by: str, reason: str) -> Reset:
    if reset.direction == "none":
        return reset
    reset_id = positions.reset_position(cur, pipeline.name, reset.topic, reset.partition, reset.position, reset.target,
                                    direction=reset.direction, ranges_retired=len(reset.retired),
                                    requested_by=requested_by, reason=reason)
    return replace(reset, rows_changed=retire_ranges(cur, pipeline, list(reset.retired), f"reset {reset_id}"))
