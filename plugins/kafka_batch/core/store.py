"""Postgres bookkeeping: schema, positions, batches and their ranges, attempts, definitions.

Positions are written here and nowhere else: stored once where a partition begins, moved by
compare-and-set when a batch commits, moved deliberately by a recorded reset. A pipeline's row in
`kafka_batch.pipelines` is locked FOR UPDATE by every change to its progress (plan, commit, reset),
so those changes are serialized per pipeline whatever Airflow runs concurrently.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg2
import pyarrow as pa

from kafka_batch.config import PROJECT_ROOT, Pipeline, from_snapshot
from kafka_batch.core.ranges import OffsetRange
from kafka_batch.core.state import RUNNABLE, BatchStatus, check, sources
from kafka_batch.errors import FencedAttempt, InputError, ServiceError, StateError

BATCH_KINDS = ("batch", "replay")  # a replay recomputes committed ranges and never moves a position


def sql_dir() -> Path:
    return Path(os.environ.get("KAFKA_BATCH_SQL_DIR", PROJECT_ROOT / "sql"))


# What the guarantee needs from every session, set by the project rather than assumed. A dead job must
# not hold row locks, and nothing waits forever; the connection's `options` extra may override these.
SESSION_SETTINGS = {
    "synchronous_commit": "on",
    "default_transaction_isolation": "read committed",  # the commit relies on row locks and compare-and-set
    "lock_timeout": "60s",
    "idle_in_transaction_session_timeout": "10min",
    "statement_timeout": "30min",
}


def connect(params: dict) -> psycopg2.extensions.connection:
    """A session with SESSION_SETTINGS; a refused or unreachable server is one clear error."""
    ours = " ".join(f"-c {k}={v.replace(' ', chr(92) + ' ')}" for k, v in SESSION_SETTINGS.items())
    params = {**params, "options": f"{ours} {params.get('options', '')}".strip()}
    try:
        return psycopg2.connect(**params)
    except psycopg2.OperationalError as exc:
        where = f"Postgres at {params.get('host')}:{params.get('port', 5432)} (database {params.get('dbname')})"
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if any(word in reason for word in ("authentication failed", "does not exist", "no password", "role")):
            raise InputError(f"{where} refused the connection: {reason}") from None
        raise ServiceError(f"{where} did not answer: {reason}") from None


@contextmanager
def transaction(conn) -> Iterator:
    """One transaction: commit on success, roll back on any error."""
    with conn:
        with conn.cursor() as cur:
            yield cur


def pending_migrations(conn) -> bool:
    """Whether any sql/NNN_*.sql file is not applied yet: a read, no DDL and no lock."""
    files = {path.name for path in sql_dir().glob("[0-9][0-9][0-9]_*.sql")}
    with transaction(conn) as cur:
        cur.execute("SELECT to_regclass('public.kafka_batch_migrations') IS NOT NULL")
        if not cur.fetchone()[0]:
            return True
        cur.execute("SELECT version FROM public.kafka_batch_migrations")
        return bool(files - {row[0] for row in cur.fetchall()})


def apply_migrations(conn) -> list[str]:
    """Apply sql/NNN_*.sql files not applied yet, each once, under an advisory lock."""
    if not pending_migrations(conn):
        return []
    applied = []
    with transaction(conn) as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('kafka_batch.migrations'))")
        cur.execute(
            "CREATE TABLE IF NOT EXISTS public.kafka_batch_migrations"
            " (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur.execute("SELECT version FROM public.kafka_batch_migrations")
        done = {row[0] for row in cur.fetchall()}
        for path in sorted(sql_dir().glob("[0-9][0-9][0-9]_*.sql")):
            if path.name in done:
                continue
            cur.execute(path.read_text())
            cur.execute("INSERT INTO public.kafka_batch_migrations (version) VALUES (%s)", (path.name,))
            applied.append(path.name)
    return applied


def ensure_pipeline(conn, pipeline: Pipeline) -> None:
    """Register the pipeline and create its sinks' tables (each sink refuses tables that differ).

    Tables that already exist are only checked: no DDL, so this never waits behind a running commit.
    """
    with transaction(conn) as cur:
        cur.execute("SELECT 1 FROM kafka_batch.pipelines WHERE name = %s", (pipeline.name,))
        if cur.fetchone() is None:
            cur.execute("INSERT INTO kafka_batch.pipelines (name) VALUES (%s) ON CONFLICT DO NOTHING", (pipeline.name,))
        for sink in pipeline.sinks:
            sink.create(cur, pipeline.name)


def lock_pipeline(cur, pipeline_name: str) -> None:
    cur.execute("SELECT name FROM kafka_batch.pipelines WHERE name = %s FOR UPDATE", (pipeline_name,))
    if cur.fetchone() is None:
        raise StateError(f"pipeline {pipeline_name!r} is not registered in kafka_batch.pipelines")


# --- positions -----------------------------------------------------------------------------------

def store_initial_positions(cur, pipeline_name: str, initial: dict[tuple[str, int], int]) -> None:
    """Where partitions without a position begin; only inserts, never moves a stored position."""
    for (topic, partition), offset in initial.items():
        cur.execute(
            "INSERT INTO kafka_batch.offsets (pipeline, topic, partition, next_offset) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (pipeline_name, topic, partition, offset),
        )


def read_positions(cur, pipeline_name: str) -> dict[tuple[str, int], int]:
    cur.execute(
        "SELECT topic, partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s", (pipeline_name,)
    )
    return {(topic, partition): offset for topic, partition, offset in cur.fetchall()}


def _compare_and_set(cur, pipeline_name: str, topic: str, partition: int, expected: int, new: int,
                     batch_id: int | None) -> bool:
    cur.execute(
        "UPDATE kafka_batch.offsets SET next_offset = %s, updated_at = now(), batch_id = %s"
        " WHERE pipeline = %s AND topic = %s AND partition = %s AND next_offset = %s",
        (new, batch_id, pipeline_name, topic, partition, expected),
    )
    return cur.rowcount == 1


def move_positions(cur, pipeline_name: str, batch_id: int, ranges: list[OffsetRange]) -> None:
    """The core move for every range of a batch in one statement: `from` -> `until` on each row only
    if its stored position is `from`; one range that does not match and nothing commits."""
    keys = {(r.topic, r.partition) for r in ranges}
    if len(keys) != len(ranges):
        raise StateError(f"batch {batch_id}: two ranges of one partition; nothing was committed")
    cur.execute(
        "UPDATE kafka_batch.offsets o SET next_offset = r.until_offset, updated_at = now(), batch_id = %s"
        " FROM (SELECT unnest(%s::text[]) AS topic, unnest(%s::int[]) AS partition,"
        " unnest(%s::bigint[]) AS from_offset, unnest(%s::bigint[]) AS until_offset) r"
        " WHERE o.pipeline = %s AND o.topic = r.topic AND o.partition = r.partition AND o.next_offset = r.from_offset"
        " RETURNING o.topic, o.partition",
        (batch_id, [r.topic for r in ranges], [r.partition for r in ranges], [r.from_offset for r in ranges],
         [r.until_offset for r in ranges], pipeline_name),
    )
    moved = set(cur.fetchall())
    for r in ranges:
        if (r.topic, r.partition) not in moved:
            _refuse_move(cur, pipeline_name, batch_id, r)


def _refuse_move(cur, pipeline_name: str, batch_id: int, r: OffsetRange) -> None:
    cur.execute(
        "SELECT next_offset FROM kafka_batch.offsets WHERE pipeline = %s AND topic = %s AND partition = %s",
        (pipeline_name, r.topic, r.partition),
    )
    row = cur.fetchone()
    stored = "no stored position" if row is None else f"stored position {row[0]}"
    raise StateError(
        f"batch {batch_id}: range {r} expected position {r.from_offset} but found {stored}; "
        "another batch moved this partition, nothing was committed"
    )


def reset_position(cur, pipeline_name: str, topic: str, partition: int, expected: int, target: int, *,
                   direction: str, ranges_retired: int, requested_by: str, reason: str) -> int:
    """A deliberate move (rewind or skip), recorded in kafka_batch.resets; refused if the position moved.

    Returns the reset's id.
    """
    if not _compare_and_set(cur, pipeline_name, topic, partition, expected, target, None):
        raise StateError(f"{topic}[{partition}]: the position moved while resetting; nothing changed")
    cur.execute(
        "INSERT INTO kafka_batch.resets (pipeline, topic, partition, from_position, to_position, direction,"
        " ranges_retired, requested_by, reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (pipeline_name, topic, partition, expected, target, direction, ranges_retired, requested_by, reason),
    )
    return cur.fetchone()[0]


# --- batches ---------------------------------------------------------------------------------------

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
_RANGE_COLUMNS = "topic, partition, from_offset, until_offset, id, lost_until"


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


def load_batch(conn, batch_id: int) -> Batch:
    with transaction(conn) as cur:
        batch = select_batch(cur, batch_id)
    if batch is None:
        raise StateError(f"batch {batch_id} does not exist")
    return batch


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
            " (batch_id, topic, partition, from_offset, until_offset, lost_until, lost_detected_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, CASE WHEN %s IS NULL THEN NULL ELSE now() END)",
            (batch_id, r.topic, r.partition, r.from_offset, r.until_offset, r.lost_until, r.lost_until),
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


def lock_current_attempt(cur, pipeline_name: str, batch_id: int, attempt: int) -> Batch:
    """Lock the pipeline and the batch; refuse an attempt that is no longer the batch's current one.

    A committed batch is returned as it is (committing it again is a no-op).
    """
    lock_pipeline(cur, pipeline_name)
    batch = select_batch(cur, batch_id, lock=True)
    if batch is None or batch.pipeline != pipeline_name:
        raise StateError(f"batch {batch_id} does not exist for pipeline {pipeline_name!r}")
    if batch.status == BatchStatus.COMMITTED:
        return batch
    if not batch.runnable:
        raise FencedAttempt(f"batch {batch_id} is {batch.status} ({batch.error}); it can no longer commit")
    if batch.attempt != attempt:
        raise FencedAttempt(
            f"batch {batch_id}: attempt {attempt} is stale, attempt {batch.attempt} started since; not committing"
        )
    return batch


def finish(cur, batch: Batch, new: BatchStatus, counts: dict, read_tasks: int | None = None) -> None:
    """The commit's (or preview's) last step: the batch's final status and counts, under its lock."""
    check(batch.id, batch.status, new)
    set_status(cur, batch.id, new, attempt=batch.attempt)
    cur.execute(
        "UPDATE kafka_batch.batches SET records_read = %s, records_tombstone = %s, records_invalid = %s,"
        " read_tasks = %s WHERE id = %s",
        (sum(c.records for c in counts.values()), sum(c.tombstones for c in counts.values()),
         sum(c.invalid for c in counts.values()), read_tasks, batch.id),
    )


def live_ranges(cur, pipeline_name: str, topic: str, partition: int) -> list[OffsetRange]:
    """The committed ranges of a partition whose effect is in the outputs now, in offset order."""
    cur.execute(
        f"SELECT {_RANGE_COLUMNS} FROM kafka_batch.live_ranges"
        " WHERE pipeline = %s AND topic = %s AND partition = %s ORDER BY from_offset",
        (pipeline_name, topic, partition),
    )
    return [OffsetRange(*row) for row in cur.fetchall()]


def replaced_ranges(cur, batch_id: int, *, lock: bool = False) -> list[tuple[OffsetRange, str | None]]:
    """The committed ranges a replay recomputes, each with what retired it since (None: still live)."""
    cur.execute(
        "SELECT o.topic, o.partition, o.from_offset, o.until_offset, o.id, o.lost_until, o.retired_by"
        " FROM kafka_batch.batch_ranges n JOIN kafka_batch.batch_ranges o ON o.id = n.replaces_range_id"
        " WHERE n.batch_id = %s ORDER BY o.id" + (" FOR UPDATE OF o" if lock else ""),
        (batch_id,),
    )
    return [(OffsetRange(*row[:6]), row[6]) for row in cur.fetchall()]


def ranges_beyond(cur, pipeline_name: str, horizon) -> list[int]:
    """The live ranges older than every bound of the replay horizon (config.Replayable), not folded yet."""
    conditions, params = [], [pipeline_name]
    if horizon.batches is not None:
        conditions.append("b.id NOT IN (SELECT id FROM kafka_batch.batches WHERE pipeline = %s AND status = 'committed'"
                          " ORDER BY committed_at DESC, id DESC LIMIT %s)")
        params += [pipeline_name, horizon.batches]
    if horizon.days is not None:
        conditions.append("b.committed_at < now() - make_interval(secs => %s)")
        params.append(horizon.days * 86400)
    if not conditions:
        return []
    cur.execute(
        "SELECT r.id FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b ON b.id = r.batch_id"
        " WHERE b.pipeline = %s AND b.status = 'committed' AND r.retired_at IS NULL AND r.folded_at IS NULL AND "
        + " AND ".join(conditions) + " ORDER BY r.id",
        params,
    )
    return [row[0] for row in cur.fetchall()]


def mark_folded(cur, range_ids: list[int]) -> None:
    cur.execute("UPDATE kafka_batch.batch_ranges SET folded_at = now() WHERE id = ANY(%s)", (range_ids,))


def folded(cur, range_ids: list[int]) -> dict[int, datetime]:
    """When each of the ranges was folded (left the replay horizon), for those that were."""
    cur.execute("SELECT id, folded_at FROM kafka_batch.batch_ranges WHERE id = ANY(%s) AND folded_at IS NOT NULL",
                (range_ids,))
    return dict(cur.fetchall())


def retire(cur, range_ids: list[int], retired_by: str) -> None:
    """Committed ranges leave the live ledger (their rows stay, marked why) and the quarantine."""
    cur.execute(
        "UPDATE kafka_batch.batch_ranges SET retired_at = now(), retired_by = %s WHERE id = ANY(%s)",
        (retired_by, range_ids),
    )
    cur.execute("DELETE FROM kafka_batch.quarantine WHERE range_id = ANY(%s)", (range_ids,))


def quarantine(cur, pipeline_name: str, batch_id: int, records: pa.Table) -> int:
    """Inside the commit: the batch's invalid records, with their reasons (COPY, not row by row)."""
    if records.num_rows == 0:
        return 0
    columns = ["range_id", "offset", "topic", "partition", "timestamp", "key", "value", "value_bytes", "reason"]
    cur.execute("CREATE TEMP TABLE quarantine_stage ON COMMIT DROP AS"
                " SELECT range_id, \"offset\", topic, partition, \"timestamp\", key, value, value_bytes, reason"
                " FROM kafka_batch.quarantine WITH NO DATA")
    buffer = io.BytesIO()
    for row in records.select(columns).to_pylist():  # bounded by max_invalid_ratio; bytea needs escaping
        buffer.write(("\t".join(_copy_text(row[c]) for c in columns) + "\n").encode())
    buffer.seek(0)
    cur.copy_expert("COPY quarantine_stage FROM STDIN", buffer)
    cur.execute(
        "INSERT INTO kafka_batch.quarantine (range_id, \"offset\", pipeline, batch_id, topic, partition,"
        " \"timestamp\", key, value, value_bytes, reason) SELECT range_id, \"offset\", %s, %s, topic, partition,"
        " \"timestamp\", key, value, value_bytes, reason FROM quarantine_stage",
        (pipeline_name, batch_id),
    )
    cur.execute("DROP TABLE quarantine_stage")
    return records.num_rows


def quarantined(cur, pipeline_name: str, limit: int) -> list[dict]:
    """The newest quarantined records of a pipeline (live ranges only: a replay or rewind removed the rest)."""
    cur.execute(
        "SELECT topic, partition, \"offset\", batch_id, \"timestamp\", value_bytes, reason,"
        " encode(substring(value from 1 for 60), 'escape') FROM kafka_batch.quarantine"
        " WHERE pipeline = %s ORDER BY batch_id DESC, topic, partition, \"offset\" LIMIT %s",
        (pipeline_name, limit),
    )
    names = ("topic", "partition", "offset", "batch_id", "timestamp", "value_bytes", "reason", "value_start")
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _copy_text(value) -> str:
    """A value in COPY's text format: \\N for null, bytea as hex, tabs and newlines escaped."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def record_range_counts(cur, counts: dict) -> None:
    """Per range id, what it held (objects with `records`, `tombstones` and `invalid`); one statement."""
    ids = list(counts)
    cur.execute(
        "UPDATE kafka_batch.batch_ranges b SET records_read = c.records, records_tombstone = c.tombstones,"
        " records_invalid = c.invalid FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::bigint[]) AS records,"
        " unnest(%s::bigint[]) AS tombstones, unnest(%s::bigint[]) AS invalid) c WHERE b.id = c.id",
        (ids, [counts[i].records for i in ids], [counts[i].tombstones for i in ids], [counts[i].invalid for i in ids]),
    )


def record_data_loss(cur, pipeline_name: str, batch_id: int) -> None:
    """Inside the commit: every gap the batch moves past, into the data_loss ledger."""
    cur.execute(
        "INSERT INTO kafka_batch.data_loss (pipeline, topic, partition, lost_from, lost_until, detected_at, batch_id)"
        " SELECT %s, topic, partition, from_offset, lost_until, lost_detected_at, batch_id"
        " FROM kafka_batch.batch_ranges WHERE batch_id = %s AND lost_until IS NOT NULL AND replaces_range_id IS NULL",
        (pipeline_name, batch_id),
    )


def record_loss(conn, range_id: int, lost_until: int) -> None:
    """Under on_data_loss=skip: retention overtook a planned range before it was read."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batch_ranges SET lost_until = %s, lost_detected_at = now()"
            " WHERE id = %s AND (lost_until IS NULL OR lost_until < %s)",
            (lost_until, range_id, lost_until),
        )


# --- attempts ------------------------------------------------------------------------------------

def claim_attempt(conn, batch_id: int, try_number: int | None = None) -> int:
    """Start a new attempt of a runnable batch: any older attempt still running can no longer commit."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batches SET attempt = attempt + 1, started_at = now(),"
            " try_number = coalesce(%s, try_number) WHERE id = %s AND status = ANY(%s) RETURNING attempt",
            (try_number, batch_id, list(RUNNABLE)),
        )
        row = cur.fetchone()
    if row is None:
        batch = load_batch(conn, batch_id)
        raise StateError(f"batch {batch_id} is {batch.status}; it can no longer be executed")
    return row[0]


def current_attempt(conn, batch_id: int) -> tuple[int, str] | None:
    """The batch's attempt token and status (a fence watch stops when either changes)."""
    with transaction(conn) as cur:
        cur.execute("SELECT attempt, status FROM kafka_batch.batches WHERE id = %s", (batch_id,))
        row = cur.fetchone()
    return None if row is None else (row[0], row[1])


def mark_failed(conn, batch_id: int, attempt: int, error: str) -> None:
    """Record why the current attempt failed; a committed or newer attempt is left alone."""
    with transaction(conn) as cur:
        set_status(cur, batch_id, BatchStatus.FAILED, attempt=attempt, error=error)


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
