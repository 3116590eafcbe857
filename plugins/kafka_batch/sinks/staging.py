"""Staging: rows that executors COPY into an attempt's own table, for the commit to move into place.

Results too big for the driver never pass through it: each Spark task COPYs its rows into an unlogged
table of the attempt (`kafka_batch_stage.b<batch>_a<attempt>_<sink>`) and reports only counts. A
zombie attempt stages into its own table, which no commit ever moves; a retried Spark task first
replaces what its killed try may have committed (matched by the rows' key), so a row is never staged
twice or lost, and the commit checks the staged rows against the counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg2 import sql

from kafka_batch.sinks.base import RangeCounts, copy_arrow, same, sums_by_range

if TYPE_CHECKING:  # pyarrow where a sink computes (see kafka_batch.sinks)
    import pyarrow as pa

STAGE_SCHEMA = "kafka_batch_stage"
COUNTS = ("records", "tombstones", "invalid")
# What a task reports: per range, the records it counted and the rows it staged.
REPORT_SCHEMA = "range_id long, records long, tombstones long, invalid long, staged long"


@dataclass(frozen=True)
class StagedRows:
    """Where an attempt's rows wait for the commit, and how many the tasks staged."""

    stage: str
    rows: int


def stage_name(batch_id: int, attempt: int, kind: str) -> str:
    return f"b{batch_id}_a{attempt}_{kind}"


def create_stage(postgres: dict, batch_id: int, attempt: int, kind: str, like: sql.Composable) -> str:
    """An empty staging table for one attempt, shaped like `like` (unlogged: a retry rebuilds it)."""
    import psycopg2

    name = stage_name(batch_id, attempt, kind)
    conn = psycopg2.connect(**postgres)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(STAGE_SCHEMA, name)))
            cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(sql.Identifier(STAGE_SCHEMA, name), like))
    finally:
        conn.close()
    return name


def discard(cur, batch_id: int, attempt: int | None, kind: str) -> None:
    """Drop an attempt's staging table (attempt None: every attempt's)."""
    pattern = stage_name(batch_id, attempt, kind) if attempt is not None else f"b{batch_id}\\_a%\\_{kind}"
    cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s", (STAGE_SCHEMA, pattern))
    for (name,) in cur.fetchall():
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(STAGE_SCHEMA, name)))


def staged(name: str) -> sql.Composable:
    return sql.Identifier(STAGE_SCHEMA, name)


Split = Callable[["pa.RecordBatch"], tuple["pa.RecordBatch", "pa.Table"]]


def stage_task(postgres: dict, table: str, key: Sequence[str], columns: Sequence[str], split: Split):
    """The executor side, for mapInArrow: `split` turns each batch into the rows to stage (with
    `columns`) and their counts per range (range_id, records, tombstones, invalid); the task COPYs the
    rows in one transaction and yields its counts (REPORT_SCHEMA)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg2
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        retry = context is not None and context.attemptNumber() > 0
        totals: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        target = staged(table)
        conn = psycopg2.connect(**postgres)
        try:
            with conn, conn.cursor() as cur:
                if retry:
                    cur.execute(sql.SQL("CREATE TEMP TABLE task_rows ON COMMIT DROP AS SELECT * FROM {} WITH NO DATA")
                                .format(target))
                into = sql.Identifier("task_rows") if retry else target
                for batch in batches:
                    rows, counts = split(batch)
                    for row in counts.to_pylist():
                        for i, what in enumerate(COUNTS):
                            totals[row["range_id"]][i] += row[what] or 0
                    if rows.num_rows:
                        copy_arrow(cur, into, rows.select(list(columns)))
                        for range_id, n in _per_range(rows.column("range_id")):
                            totals[range_id][3] += n
                if retry:
                    cur.execute(sql.SQL(
                        "DELETE FROM {t} s USING task_rows n WHERE {match}; INSERT INTO {t} SELECT * FROM task_rows"
                    ).format(t=target, match=same(key, "s", "n")))
        finally:
            conn.close()
        range_ids = sorted(totals)
        yield pa.RecordBatch.from_pydict({
            "range_id": pa.array(range_ids, pa.int64()),
            **{what: pa.array([totals[r][i] for r in range_ids], pa.int64())
               for i, what in enumerate((*COUNTS, "staged"))},
        })

    return write


def _per_range(range_ids: pa.Array) -> list[tuple[int, int]]:
    import pyarrow.compute as pc
    counted = pc.value_counts(range_ids)
    return list(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True))


def reported(report: pa.Table, stage: str) -> tuple[dict[int, RangeCounts], StagedRows]:
    """The tasks' reports summed: per range the counts, and the rows staged in all."""
    totals = sums_by_range(report, (*COUNTS, "staged")).to_pylist()
    counts = {row["range_id"]: RangeCounts(row["records"], row["tombstones"], row["invalid"]) for row in totals}
    return counts, StagedRows(stage, sum(row["staged"] for row in totals))


def per_range(range_ids: pa.Array, records: pa.Array, tombstones: pa.Array, invalid: pa.Array) -> pa.Table:
    """Counts summed per range (the counts `split` returns): from masks (booleans count as 1) or from
    rows that carry counts."""
    import pyarrow as pa
    table = pa.table({"range_id": range_ids, **{c: a.cast(pa.int64()) for c, a in zip(
        COUNTS, (records, tombstones, invalid), strict=True)}})
    return sums_by_range(table, COUNTS)
