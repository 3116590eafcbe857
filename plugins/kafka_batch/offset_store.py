"""All Postgres bookkeeping except the commit: schema, positions, batches and their ranges, attempts.

Positions live only here. A pipeline's row in `kafka_batch.pipelines` is locked FOR UPDATE by every
change to its progress (plan, commit), so those changes are serialized per pipeline whatever Airflow
runs concurrently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

from kafka_batch.config import PROJECT_ROOT, ConfigError, Pipeline
from kafka_batch.planner import OffsetRange


class BatchError(RuntimeError):
    """A batch cannot be executed or committed as asked; the message says which batch and why."""


def sql_dir() -> Path:
    return Path(os.environ.get("KAFKA_BATCH_SQL_DIR", PROJECT_ROOT / "sql"))


def connect(params: dict) -> psycopg2.extensions.connection:
    return psycopg2.connect(**params)


@contextmanager
def transaction(conn) -> Iterator:
    """One transaction: commit on success, roll back on any error."""
    with conn:
        with conn.cursor() as cur:
            yield cur


def apply_migrations(conn) -> list[str]:
    """Apply sql/NNN_*.sql files not applied yet, each once, under an advisory lock."""
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


def _column_defs(pipeline: Pipeline) -> list[sql.Composable]:
    return [
        sql.SQL("{} {} NOT NULL").format(sql.Identifier(c.name), sql.SQL(c.type))
        for c in pipeline.group_by + pipeline.measures
    ]


def ensure_pipeline(conn, pipeline: Pipeline) -> None:
    """Register the pipeline and create its target tables; refuse a table whose columns differ."""
    keys = sql.SQL(", ").join(sql.Identifier(c.name) for c in pipeline.group_by)
    schema, by_range = pipeline.contributions_table.split(".")
    with transaction(conn) as cur:
        cur.execute("INSERT INTO kafka_batch.pipelines (name) VALUES (%s) ON CONFLICT DO NOTHING", (pipeline.name,))
        for table_schema, table in (("public", pipeline.table), (schema, by_range)):
            cur.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                (table_schema, table),
            )
            existing = cur.fetchall()
            expected = ([("range_id", "bigint")] if table == by_range else []) + [
                (c.name, "timestamp with time zone" if c.type == "timestamptz" else c.type)
                for c in pipeline.group_by + pipeline.measures
            ]
            if existing and existing != expected:
                raise ConfigError(
                    f"pipeline {pipeline.name!r}: table {table_schema}.{table} exists with columns {existing}, "
                    f"but the aggregation defines {expected}; migrate or rename the table"
                )
        cur.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS public.{} ({}, PRIMARY KEY ({}))").format(
                sql.Identifier(pipeline.table), sql.SQL(", ").join(_column_defs(pipeline)), keys
            )
        )
        cur.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.{} (range_id bigint NOT NULL REFERENCES kafka_batch.batch_ranges (id),"
                " {}, PRIMARY KEY (range_id, {}))"
            ).format(sql.Identifier(schema), sql.Identifier(by_range), sql.SQL(", ").join(_column_defs(pipeline)), keys)
        )
        # Removing a range's contribution asks whether any other range still contributes to a key.
        cur.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {}.{} ({})").format(
                sql.Identifier(f"{by_range}_keys"[:63]), sql.Identifier(schema), sql.Identifier(by_range), keys
            )
        )


def lock_pipeline(cur, pipeline_name: str) -> None:
    cur.execute("SELECT name FROM kafka_batch.pipelines WHERE name = %s FOR UPDATE", (pipeline_name,))
    if cur.fetchone() is None:
        raise BatchError(f"pipeline {pipeline_name!r} is not registered in kafka_batch.pipelines")


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


@dataclass(frozen=True)
class Batch:
    id: int
    pipeline: str
    run_id: str
    status: str
    attempt: int
    ranges: tuple[OffsetRange, ...]
    records_read: int | None = None
    error: str | None = None
    kind: str = "batch"  # or "replay": recomputes committed ranges, never moves a position

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)

    def summary(self) -> dict:
        """What the DAG may put in XCom and logs: ids and counts, no connection details."""
        return {
            "batch_id": self.id, "kind": self.kind, "pipeline": self.pipeline, "run_id": self.run_id,
            "status": self.status,
            "ranges": [
                {"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset, "until_offset": r.until_offset}
                for r in self.ranges
            ],
            "offsets_planned": self.span, "records_read": self.records_read,
        }


_BATCH_COLUMNS = "id, pipeline, run_id, status, attempt, records_read, error, kind"


def select_batch(cur, where: str, params: tuple) -> Batch | None:
    cur.execute(f"SELECT {_BATCH_COLUMNS} FROM kafka_batch.batches WHERE {where}", params)
    row = cur.fetchone()
    if row is None:
        return None
    batch_id, pipeline, run_id, status, attempt, records_read, error, kind = row
    cur.execute(
        "SELECT topic, partition, from_offset, until_offset, id, lost_until FROM kafka_batch.batch_ranges"
        " WHERE batch_id = %s ORDER BY topic, partition, from_offset",
        (batch_id,),
    )
    ranges = tuple(OffsetRange(*r) for r in cur.fetchall())
    return Batch(batch_id, pipeline, run_id, status, attempt, ranges, records_read, error, kind)


def find_batch(cur, pipeline_name: str, dag_id: str | None, run_id: str) -> Batch | None:
    """The batch of one run; run ids are unique per DAG only (dag_id None: the CLI's runs)."""
    return select_batch(
        cur, "pipeline = %s AND coalesce(dag_id, '') = coalesce(%s, '') AND run_id = %s", (pipeline_name, dag_id, run_id)
    )


def load_batch(conn, batch_id: int) -> Batch:
    with transaction(conn) as cur:
        batch = select_batch(cur, "id = %s", (batch_id,))
    if batch is None:
        raise BatchError(f"batch {batch_id} does not exist")
    return batch


def insert_batch(cur, pipeline_name: str, run_id: str, dag_id: str | None, ranges: list[OffsetRange]) -> Batch:
    """Persist a plan. Older batches of the pipeline that never committed can no longer commit."""
    supersede_planned(cur, pipeline_name, "superseded by a newer plan")
    cur.execute(
        "INSERT INTO kafka_batch.batches (pipeline, dag_id, run_id, status) VALUES (%s, %s, %s, %s) RETURNING id",
        (pipeline_name, dag_id, run_id, "planned" if ranges else "empty"),
    )
    batch_id = cur.fetchone()[0]
    for r in ranges:
        cur.execute(
            "INSERT INTO kafka_batch.batch_ranges"
            " (batch_id, topic, partition, from_offset, until_offset, lost_until, lost_detected_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, CASE WHEN %s IS NULL THEN NULL ELSE now() END)",
            (batch_id, r.topic, r.partition, r.from_offset, r.until_offset, r.lost_until, r.lost_until),
        )
    return select_batch(cur, "id = %s", (batch_id,))


def supersede_planned(cur, pipeline_name: str, why: str) -> None:
    """Uncommitted batches (not replays) of the pipeline: they were planned from positions now moved."""
    cur.execute(
        "UPDATE kafka_batch.batches SET status = 'superseded', error = %s"
        " WHERE pipeline = %s AND kind = 'batch' AND status IN ('planned', 'failed')",
        (why, pipeline_name),
    )


def live_ranges(cur, pipeline_name: str, topic: str, partition: int) -> list[OffsetRange]:
    """The committed ranges of a partition whose contributions are in the totals now, in offset order."""
    cur.execute(
        "SELECT topic, partition, from_offset, until_offset, id, lost_until FROM kafka_batch.live_ranges"
        " WHERE pipeline = %s AND topic = %s AND partition = %s ORDER BY from_offset",
        (pipeline_name, topic, partition),
    )
    return [OffsetRange(*row) for row in cur.fetchall()]


def insert_replay(
    cur, pipeline_name: str, run_id: str, dag_id: str | None, replaced: list[OffsetRange], requested_by: str, reason: str
) -> Batch:
    """A replay batch: one new range per committed range it recomputes (same offsets)."""
    cur.execute(
        "INSERT INTO kafka_batch.batches (pipeline, dag_id, run_id, status, kind, requested_by, reason)"
        " VALUES (%s, %s, %s, 'planned', 'replay', %s, %s) RETURNING id",
        (pipeline_name, dag_id, run_id, requested_by, reason),
    )
    batch_id = cur.fetchone()[0]
    for r in replaced:
        cur.execute(
            "INSERT INTO kafka_batch.batch_ranges"
            " (batch_id, topic, partition, from_offset, until_offset, lost_until, lost_detected_at, replaces_range_id)"
            " SELECT %s, topic, partition, from_offset, until_offset, lost_until, lost_detected_at, id"
            " FROM kafka_batch.batch_ranges WHERE id = %s",
            (batch_id, r.range_id),
        )
    return select_batch(cur, "id = %s", (batch_id,))


def record_loss(conn, range_id: int, lost_until: int) -> None:
    """Under on_data_loss=skip: retention overtook a planned range before it was read."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batch_ranges SET lost_until = %s, lost_detected_at = now()"
            " WHERE id = %s AND (lost_until IS NULL OR lost_until < %s)",
            (lost_until, range_id, lost_until),
        )


def claim_attempt(conn, batch_id: int) -> int:
    """Start a new attempt of a batch: any older attempt still running can no longer commit."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batches SET attempt = attempt + 1, started_at = now()"
            " WHERE id = %s RETURNING attempt",
            (batch_id,),
        )
        row = cur.fetchone()
    if row is None:
        raise BatchError(f"batch {batch_id} does not exist")
    return row[0]


def replay_preview(conn, batch_id: int) -> list[dict]:
    """A previewed replay: per group key, the measures now and after the replay (null: absent)."""
    with transaction(conn) as cur:
        cur.execute(
            "SELECT group_key, before, after FROM kafka_batch.replay_previews WHERE batch_id = %s ORDER BY group_key::text",
            (batch_id,),
        )
        return [{"group_key": k, "before": b, "after": a} for k, b, a in cur.fetchall()]


def current_attempt(conn, batch_id: int) -> int | None:
    with transaction(conn) as cur:
        cur.execute("SELECT attempt FROM kafka_batch.batches WHERE id = %s", (batch_id,))
        row = cur.fetchone()
    return None if row is None else row[0]


def record_try(conn, batch_id: int, try_number: int) -> None:
    """The Airflow try that executes the batch, for the ledger."""
    with transaction(conn) as cur:
        cur.execute("UPDATE kafka_batch.batches SET try_number = %s WHERE id = %s", (try_number, batch_id))


def mark_failed(conn, batch_id: int, attempt: int, error: str) -> None:
    """Record why the current attempt failed; a committed or newer attempt is left alone."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batches SET status = 'failed', error = %s"
            " WHERE id = %s AND attempt = %s AND status IN ('planned', 'failed')",
            (error[:4000], batch_id, attempt),
        )
