"""The commit: positions, every sink's results, the ledger and the batch status in ONE transaction.

Every range of a batch moves its position by compare-and-set (`next_offset = from` -> `until`); a
range whose stored position is not its `from` rolls the whole transaction back, so a batch can
neither leave a gap nor count a record twice. A replay instead retires the committed ranges it
recomputes (each sink removes their effect exactly) and moves no position. Sinks are reached only
through their interface: this module knows no particular output.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_batch.config import Pipeline
from kafka_batch.core import attempts, batches, data_loss, ledger, positions, quarantine
from kafka_batch.core.database import transaction
from kafka_batch.core.state import BatchStatus
from kafka_batch.errors import StateError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.sinks.base import RangeCounts, SinkOutput, TableSink

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    already_committed: bool
    records: int
    rows_written: int


def retire_ranges(cur, pipeline: Pipeline, ranges: list[OffsetRange], retired_by: str) -> dict[str, int]:
    """Committed ranges leave every sink's output (exactly) and the live ledger; returns the rows each
    output table changed."""
    changed = {table: rows for sink in pipeline.sinks for table, rows in _per_table(sink, sink.remove(cur, ranges))}
    ledger.retire(cur, [r.range_id for r in ranges], retired_by)
    return changed


def _per_table(sink, rows: int) -> list[tuple[str, int]]:
    """A sink's rows changed, under its table (a sink that publishes has none)."""
    return [(sink.table, rows)] if isinstance(sink, TableSink) else []


def _replaced(cur, batch_id: int) -> list[OffsetRange]:
    """The live ranges a replay recomputes; refused if one was retired, or folded (it left the replay
    horizon), since the replay was planned."""
    replaced = ledger.replaced_ranges(cur, batch_id, lock=True)
    folded = ledger.folded(cur, [r.range_id for r, _ in replaced])
    for r, retired_by in replaced:
        if retired_by is not None or r.range_id in folded:
            why = f"retired by {retired_by}" if retired_by is not None else "folded (it left the replay horizon)"
            raise StateError(
                f"replay batch {batch_id}: range {r} was {why} after the replay was planned; nothing was committed"
                + (", plan the replay again" if retired_by is not None else "")
            )
    return [r for r, _ in replaced]


def fold_beyond_horizon(cur, pipeline: Pipeline) -> int:
    """Inside the commit: ranges that left the replay horizon fold into every sink's base; returns how many."""
    range_ids = ledger.ranges_beyond(cur, pipeline.name, pipeline.replayable)
    if range_ids:
        for sink in pipeline.sinks:
            sink.fold(cur, range_ids)
        ledger.mark_folded(cur, range_ids)
    return len(range_ids)


def _counts(batch: batches.Batch, outputs: Mapping[str, SinkOutput]) -> dict[int, RangeCounts]:
    """Per range, what the sinks counted: they read the same records, so they must agree."""
    counted = [output.counts for output in outputs.values() if output.counts is not None]
    counts = counted[0] if counted else {}
    if any(other != counts for other in counted[1:]):
        raise StateError(f"batch {batch.id}: the sinks counted different records per range; nothing was committed")
    unknown = set(counts) - {r.range_id for r in batch.ranges}
    if unknown:
        raise StateError(f"batch {batch.id}: results name ranges {sorted(unknown)} that are not in the batch")
    return counts


def _check_outputs(pipeline: Pipeline, outputs: Mapping[str, SinkOutput]) -> None:
    missing = {s.kind for s in pipeline.sinks} - set(outputs)
    if missing:
        raise StateError(f"pipeline {pipeline.name}: no result for sink(s) {sorted(missing)}")


def commit_batch(
    conn, pipeline: Pipeline, batch_id: int, attempt: int, outputs: Mapping[str, SinkOutput],
    read_tasks: int | None = None, quarantined: pa.Table | None = None,
    schema_ids: Mapping[int, Sequence[int]] | None = None, read_seconds: float | None = None,
    kafka_config: dict | None = None, registry_config: dict | None = None,
) -> CommitResult:
    """Commit one attempt of a batch (with the records it quarantined, and per range the ids of the
    schemas that wrote its records). Committed already: a no-op success. `read_seconds` (Spark's read and
    compute) and the commit's own statements' seconds are kept with the batch (its phases for metrics), and
    the rows it changed in each table (for lineage). Sinks that publish (to Kafka, on `kafka_config`) do
    so last, inside the transaction (Avro values through `registry_config`): docs/design.md, "Publishing to Kafka"."""
    _check_outputs(pipeline, outputs)
    started = time.monotonic()
    with transaction(conn) as cur:
        batch = attempts.lock_current_attempt(cur, pipeline.name, batch_id, attempt)
        if batch.status == BatchStatus.COMMITTED:
            return CommitResult(batch_id, True, batch.records_read or 0, 0)
        counts = _counts(batch, outputs)
        if batch.kind == "replay":
            retire_ranges(cur, pipeline, _replaced(cur, batch_id), f"replay batch {batch_id}")
        else:
            positions.move_positions(cur, pipeline.name, batch_id, batch.ranges)
        rows = {table: n for sink in pipeline.sinks if not sink.publishes
                for table, n in _per_table(sink, sink.apply(cur, outputs[sink.kind].result))}
        if quarantined is not None:
            quarantine.keep(cur, pipeline.name, batch_id, quarantined)
        ledger.record_range_counts(cur, {r.range_id: counts.get(r.range_id, RangeCounts()) for r in batch.ranges})
        ledger.record_schema_ids(cur, schema_ids or {})
        data_loss.record_data_loss(cur, pipeline.name, batch_id)
        batches.finish(cur, batch, BatchStatus.COMMITTED, counts, read_tasks,
                       phases=(read_seconds, time.monotonic() - started), rows_written=rows)
        fold_beyond_horizon(cur, pipeline)
        if pipeline.publishing_sinks:
            if kafka_config is None:
                raise StateError(f"batch {batch_id}: the pipeline publishes and no Kafka connection was given")
            pending = batches.may_commit(cur, pipeline.name)  # this batch shows as committed already
            published = {}
            for sink in pipeline.publishing_sinks:
                publishing = time.monotonic()
                messages = sink.publish(cur, outputs[sink.kind].result, batch, attempt, kafka_config, pending,
                                        registry_config)
                published[sink.topic] = {"messages": messages, "seconds": round(time.monotonic() - publishing, 3)}
            batches.record_published(cur, batch.id, published)
    return CommitResult(batch_id, False, sum(c.records for c in counts.values()), sum(rows.values()))


def preview_replay(
    conn, pipeline: Pipeline, batch_id: int, attempt: int, outputs: Mapping[str, SinkOutput],
    read_tasks: int | None = None,
) -> CommitResult:
    """A replay's dry run: each sink stores how its output would change; nothing else is committed.

    The batch ends `previewed` (it can never commit); `rows_written` is how many keys would change.
    """
    _check_outputs(pipeline, outputs)
    with transaction(conn) as cur:
        batch = attempts.lock_current_attempt(cur, pipeline.name, batch_id, attempt)
        if batch.kind != "replay" or batch.status == BatchStatus.COMMITTED:
            raise StateError(f"batch {batch_id} is a {batch.status} {batch.kind}; only a planned replay can be previewed")
        counts = _counts(batch, outputs)
        replaced = [r for r, _ in ledger.replaced_ranges(cur, batch_id)]
        changed = sum(sink.preview(cur, batch_id, replaced, outputs[sink.kind].result) for sink in pipeline.sinks)
        batches.finish(cur, batch, BatchStatus.PREVIEWED, counts, read_tasks)
    return CommitResult(batch_id, False, sum(c.records for c in counts.values()), changed)
