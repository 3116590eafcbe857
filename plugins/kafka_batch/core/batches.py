"""Batches: the ranges one run processes, persisted before Spark starts, with their status and counts.

A batch keeps the definition it was planned with (`kafka_batch.definitions`, by hash), so every
attempt, the commit and a later retry compute the same thing whatever the YAML says now. Status moves
follow `core.state`; a newer plan supersedes batches that never committed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kafka_batch.config import Pipeline, from_snapshot
from kafka_batch.core.database import connect, transaction
from kafka_batch.core.state import RUNNABLE, BatchStatus, check, sources
from kafka_batch.errors import StateError
from kafka_batch.kafka.ranges import OffsetRange

BATCH_KINDS = ("batch", "replay")  # a replay recomputes committed ranges and never moves a position


@dataclass(frozen=True)
class Batch:
    id: int
    pipeline: str
    run_id: str
    status: BatchStatus
    attempt: int
    ranges: tuple[OffsetRange, ...]
    records_read: int | None = None
    error: str | None = None
    kind: str = "batch"
    definition_hash: str | None = None
    records_invalid: int | None = None

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)

    @property
    def runnable(self) -> bool:
        return self.status.runnable

    def summary(self) -> dict:
        """What the DAG may put in XCom and logs: ids and counts, no connection details."""
        return {
            "batch_id": self.id, "kind": self.kind, "pipeline": self.pipeline, "run_id": self.run_id,
            "status": self.status.value, "definition_hash": self.definition_hash,
            "ranges": [
                {"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset, "until_offset": r.until_offset}
                for r in self.ranges
            ],
            "offsets_planned": self.span, "records_read": self.records_read, "records_invalid": self.records_invalid,
        }


_SELECT_BATCH = (
    "SELECT id, pipeline, run_id, status, attempt, records_read, error, kind, definition_hash, records_invalid"
    " FROM kafka_batch.batches WHERE "
)


# A range as OffsetRange takes it: what every range has (the ledger's views too), then what a plan adds.
RANGE_COLUMNS = "topic, partition, from_offset, until_offset, id, lost_until"
_RANGE_COLUMNS = f"{RANGE_COLUMNS}, until_epoch, truncated_from"


def _batch(cur, row) -> Batch | None:
    if row is None:
        return None
    batch_id, pipeline, run_id, status, attempt, records_read, error, kind, definition_hash, records_invalid = row
    cur.execute(
        f"SELECT {_RANGE_COLUMNS} FROM kafka_batch.batch_ranges WHERE batch_id = %s ORDER BY topic, partition, from_offset",
        (batch_id,),
    )
    ranges = tuple(OffsetRange(*r) for r in cur.fetchall())
    return Batch(batch_id, pipeline, run_id, BatchStatus(status), attempt, ranges, records_read, error, kind,
                 definition_hash, records_invalid)


def select_batch(cur, batch_id: int, *, lock: bool = False) -> Batch | None:
    cur.execute(_SELECT_BATCH + "id = %s" + (" FOR UPDATE" if lock else ""), (batch_id,))
    return _batch(cur, cur.fetchone())


def find_batch(cur, pipeline_name: str, dag_id: str | None, run_id: str) -> Batch | None:
    """The batch of one run; run ids are unique per DAG only (dag_id None: the CLI's runs)."""
    cur.execute(
        _SELECT_BATCH + "pipeline = %s AND coalesce(dag_id, '') = coalesce(%s, '') AND run_id = %s",
        (pipeline_name, dag_id, run_id),
    )
    return _batch(cur, cur.fetchone())


def unfinished(cur, pipeline_name: str) -> Batch | None:
    """The pipeline's newest batch (not a replay) that may still commit: planned, or failed."""
    cur.execute(_SELECT_BATCH + "pipeline = %s AND kind = 'batch' AND status = ANY(%s) ORDER BY id DESC LIMIT 1",
                (pipeline_name, list(RUNNABLE)))
    return _batch(cur, cur.fetchone())


def may_commit(cur, pipeline_name: str) -> dict[int, str]:
    """Every batch of the pipeline that may still commit (replays too), described for a message:
    `<status>, run <run id>`."""
    cur.execute("SELECT id, status || ', run ' || run_id FROM kafka_batch.batches WHERE pipeline = %s"
                " AND status = ANY(%s)", (pipeline_name, list(RUNNABLE)))
    return dict(cur.fetchall())


def load_batch(conn, batch_id: int) -> Batch:
    with transaction(conn) as cur:
        batch = select_batch(cur, batch_id)
    if batch is None:
        raise StateError(f"batch {batch_id} does not exist")
    return batch


def recorded_error(postgres: dict, batch_id: int) -> str:
    """The error the batch's job recorded, for the message of a failed execution (a job may fail before
    it records one, or Postgres may not say)."""
    try:
        conn = connect(postgres)
        try:
            error = load_batch(conn, batch_id).error
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - the job's own log still says why
        return f"the Spark job failed, and its recorded error could not be read ({type(exc).__name__})"
    return error or "the Spark job failed before it recorded an error; its log says why"


def _store_definition(cur, pipeline: Pipeline) -> str:
    cur.execute(
        "INSERT INTO kafka_batch.definitions (hash, pipeline, definition) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (pipeline.definition_hash, pipeline.name, pipeline.snapshot()),
    )
    return pipeline.definition_hash


def batch_pipeline(conn, batch: Batch) -> Pipeline:
    """The definition the batch was planned with: every attempt and the commit compute with it."""
    if batch.definition_hash is None:
        raise StateError(f"batch {batch.id} was planned before definitions were stored with batches; plan a new one")
    with transaction(conn) as cur:
        cur.execute("SELECT definition FROM kafka_batch.definitions WHERE hash = %s", (batch.definition_hash,))
        (definition,) = cur.fetchone()
    return from_snapshot(definition, source=f"batch {batch.id} (definition {batch.definition_hash[:12]})")


def _insert_batch(cur, pipeline: Pipeline, run_id: str, dag_id: str | None, status: BatchStatus, kind: str,
                  requested_by: str | None = None, reason: str | None = None) -> int:
    cur.execute(
        "INSERT INTO kafka_batch.batches (pipeline, dag_id, run_id, status, kind, requested_by, reason, definition_hash)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (pipeline.name, dag_id, run_id, status.value, kind, requested_by, reason, _store_definition(cur, pipeline)),
    )
    return cur.fetchone()[0]


def insert_batch(cur, pipeline: Pipeline, run_id: str, dag_id: str | None, ranges: list[OffsetRange],
                 lag: int | None = None) -> Batch:
    """Persist a plan. Older batches of the pipeline that never committed can no longer commit.

    `lag` (offsets behind the last stable offsets when planned) is kept for the console's history.
    """
    supersede_planned(cur, pipeline.name, "superseded by a newer plan")
    status = BatchStatus.PLANNED if ranges else BatchStatus.EMPTY
    batch_id = _insert_batch(cur, pipeline, run_id, dag_id, status, "batch")
    if lag is not None:
        cur.execute("UPDATE kafka_batch.batches SET lag_at_plan = %s WHERE id = %s", (lag, batch_id))
    for r in ranges:
        cur.execute(
            "INSERT INTO kafka_batch.batch_ranges"
            " (batch_id, topic, partition, from_offset, until_offset, lost_until, lost_detected_at, until_epoch,"
            " truncated_from)"
            " VALUES (%s, %s, %s, %s, %s, %s, CASE WHEN %s IS NULL AND %s IS NULL THEN NULL ELSE now() END, %s, %s)",
            (batch_id, r.topic, r.partition, r.from_offset, r.until_offset, r.lost_until, r.lost_until,
             r.truncated_from, r.until_epoch, r.truncated_from),
        )
    return select_batch(cur, batch_id)


def insert_replay(
    cur, pipeline: Pipeline, run_id: str, dag_id: str | None, replaced: list[OffsetRange], requested_by: str,
    reason: str,
) -> Batch:
    """A replay batch: one new range per committed range it recomputes (same offsets)."""
    batch_id = _insert_batch(cur, pipeline, run_id, dag_id, BatchStatus.PLANNED, "replay", requested_by, reason)
    for r in replaced:
        cur.execute(
            "INSERT INTO kafka_batch.batch_ranges"
            " (batch_id, topic, partition, from_offset, until_offset, lost_until, lost_detected_at, replaces_range_id)"
            " SELECT %s, topic, partition, from_offset, until_offset, lost_until, lost_detected_at, id"
            " FROM kafka_batch.batch_ranges WHERE id = %s",
            (batch_id, r.range_id),
        )
    return select_batch(cur, batch_id)


def set_status(cur, batch_id: int, new: BatchStatus, *, attempt: int | None = None, error: str | None = None) -> bool:
    """Move one batch to `new` if the transitions allow it (and `attempt` is still current)."""
    cur.execute(
        "UPDATE kafka_batch.batches SET status = %s, error = %s,"
        " committed_at = CASE WHEN %s = 'committed' THEN now() ELSE committed_at END"
        " WHERE id = %s AND status = ANY(%s) AND (%s::int IS NULL OR attempt = %s)",
        (new.value, None if error is None else error[:4000], new.value, batch_id, sources(new), attempt, attempt),
    )
    return cur.rowcount == 1


def supersede_planned(cur, pipeline_name: str, why: str) -> None:
    """Uncommitted batches (not replays) of the pipeline: they were planned from positions now moved.

    The error of a failed batch is kept after the reason, so the diagnosis is not lost.
    """
    cur.execute(
        "UPDATE kafka_batch.batches SET status = %s,"
        " error = CASE WHEN error IS NULL THEN %s ELSE %s || '; it had failed: ' || error END"
        " WHERE pipeline = %s AND kind = 'batch' AND status = ANY(%s)",
        (BatchStatus.SUPERSEDED.value, why, why, pipeline_name, sources(BatchStatus.SUPERSEDED)),
    )


def finish(cur, batch: Batch, new: BatchStatus, counts: dict, read_tasks: int | None = None,
           phases: tuple[float | None, float | None] = (None, None), rows_written: dict[str, int] | None = None) -> None:
    """The commit's (or preview's) last step: the batch's final status and counts, under its lock;
    `phases`: the seconds of its read (and compute) and of its commit, for metrics; `rows_written`: the
    rows it changed per table, for lineage."""
    check(batch.id, batch.status, new)
    set_status(cur, batch.id, new, attempt=batch.attempt)
    cur.execute(
        "UPDATE kafka_batch.batches SET records_read = %s, records_tombstone = %s, records_invalid = %s,"
        " read_tasks = %s, read_seconds = %s, commit_seconds = %s, rows_written = %s WHERE id = %s",
        (sum(c.records for c in counts.values()), sum(c.tombstones for c in counts.values()),
         sum(c.invalid for c in counts.values()), read_tasks, *phases,
         None if rows_written is None else json.dumps(rows_written), batch.id),
    )


def record_published(cur, batch_id: int, published: dict[str, dict]) -> None:
    """Inside the commit, after its Kafka sinks published: per topic the messages and seconds, for metrics."""
    cur.execute("UPDATE kafka_batch.batches SET published = %s WHERE id = %s", (json.dumps(published), batch_id))


def pending_recompute(cur, pipeline_name: str, dag_id: str | None, prefix: str) -> tuple[int, int | None]:
    """Replays whose run id starts with `prefix`: how many, and the newest one still runnable."""
    cur.execute(
        "SELECT count(*), max(id) FILTER (WHERE status = ANY(%s)) FROM kafka_batch.batches"
        " WHERE pipeline = %s AND coalesce(dag_id, '') = coalesce(%s, '') AND kind = 'replay'"
        " AND starts_with(run_id, %s)",
        (list(RUNNABLE), pipeline_name, dag_id, prefix),
    )
    return cur.fetchone()


def replay_preview(conn, batch_id: int) -> list[dict]:
    """A previewed replay: per sink table and key, the values now and after the replay (null: absent)."""
    with transaction(conn) as cur:
        cur.execute(
            "SELECT target, group_key, before, after FROM kafka_batch.replay_previews WHERE batch_id = %s"
            " ORDER BY target, group_key::text",
            (batch_id,),
        )
        return [{"table": t, "group_key": k, "before": b, "after": a} for t, k, b, a in cur.fetchall()]
