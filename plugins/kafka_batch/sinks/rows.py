"""The rows sink: every visible record's projected columns, keyed by (topic, partition, offset).

Rows never pass through the driver: each Spark task COPYs its rows into an unlogged staging table of
the attempt (`kafka_batch_stage.b<batch>_a<attempt>_rows`), and the commit transaction moves that
table's rows into place. A zombie attempt stages into its own table, which no commit ever moves.
Removing ranges deletes their offsets, so replay and rewind are exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql
from pydantic import model_validator

from kafka_batch.errors import StateError
from kafka_batch.ranges import OffsetRange
from kafka_batch.sinks import base
from kafka_batch.sinks.base import RangeCounts, Sink, SinkOutput, StageContext

KEY = ("kafka_topic", "kafka_partition", "kafka_offset")
_KEY_TYPES = (("kafka_topic", "text"), ("kafka_partition", "integer"), ("kafka_offset", "bigint"))
STAGE_SCHEMA = "kafka_batch_stage"


@dataclass(frozen=True)
class StagedRows:
    """Where an attempt's rows wait for the commit, and how many there are."""

    stage: str
    rows: int


class RowsSink(Sink):
    """Every visible record's columns, once: `sinks: {rows: {table, columns}}`."""

    kind = "rows"
    columns: base.columns(base.ColumnSpec)
    """The columns besides the record's key (kafka_topic, kafka_partition, kafka_offset), which every row has."""

    @model_validator(mode="after")
    def _not_the_key(self) -> RowsSink:
        reserved = sorted({c.name for c in self.columns} & set(KEY))
        if reserved:
            raise ValueError(f"column name(s) {reserved} are reserved for the record's key")
        return self

    @property
    def columns_used(self) -> tuple[base.Column, ...]:
        return self.columns

    @property
    def column_names(self) -> list[str]:
        return [*KEY, *(c.name for c in self.columns)]

    @property
    def _target(self) -> sql.Composable:
        return sql.Identifier("public", self.table)

    def stage_name(self, batch_id: int, attempt: int) -> str:
        return f"b{batch_id}_a{attempt}_{self.kind}"

    def create_stage(self, cur, batch_id: int, attempt: int) -> str:
        """An empty staging table for one attempt (unlogged: it is rebuilt by a retry, never recovered)."""
        name = self.stage_name(batch_id, attempt)
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(STAGE_SCHEMA, name)))
        cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(sql.Identifier(STAGE_SCHEMA, name), self._target))
        return name

    def create(self, cur, pipeline_name: str) -> None:
        expected = [(n, t) for n, t in _KEY_TYPES] + [(c.name, c.catalog_type) for c in self.columns]
        if base.require_columns(cur, pipeline_name, "public", self.table, expected):
            return
        defs = sql.SQL(", ").join(
            [sql.SQL("{} {} NOT NULL").format(sql.Identifier(n), sql.SQL(t)) for n, t in _KEY_TYPES]
            + [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type)) for c in self.columns]
        )
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            self._target, defs, base.names(KEY)
        ))

    def compute(self, records, stage: StageContext) -> SinkOutput:
        """Executors COPY their rows into the attempt's staging table; only counts reach the driver."""
        import psycopg2
        from pyspark.sql import functions as F

        conn = psycopg2.connect(**stage.postgres)
        try:
            with conn, conn.cursor() as cur:
                name = self.create_stage(cur, stage.batch_id, stage.attempt)
        finally:
            conn.close()
        projected = records.select(
            "range_id", "_tombstone", F.col("_invalid").isNotNull().alias("_invalid"),
            F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"),
            *[F.expr(c.expr).cast(c.spark_type).alias(c.name) for c in self.columns],
        )
        written = projected.mapInArrow(
            stage_rows(stage.postgres, name, self.column_names),
            "range_id long, records long, tombstones long, invalid long",
        ).toArrow()
        totals = written.group_by("range_id").aggregate([(c, "sum") for c in ("records", "tombstones", "invalid")])
        counts = {t["range_id"]: RangeCounts(t["records_sum"], t["tombstones_sum"], t["invalid_sum"])
                  for t in totals.to_pylist()}
        return SinkOutput(counts, StagedRows(name, sum(c.records for c in counts.values())))

    def apply(self, cur, result: StagedRows) -> int:
        """Move the attempt's staged rows into place: the key refuses a record written twice, the count
        a record whose write was lost (a task retry must replace what its killed try wrote, not drop it)."""
        staged = sql.Identifier(STAGE_SCHEMA, result.stage)
        cur.execute(sql.SQL("INSERT INTO {} ({cols}) SELECT {cols} FROM {}").format(
            self._target, staged, cols=base.names(self.column_names)
        ))
        moved = cur.rowcount
        if moved != result.rows:
            raise StateError(f"the rows sink staged {moved} rows for {result.rows} counted records in {result.stage};"
                             " nothing was committed")
        cur.execute(sql.SQL("DROP TABLE {}").format(staged))
        return moved

    def remove(self, cur, ranges: Sequence[OffsetRange]) -> int:
        """Delete every row whose offset lies in one of the ranges."""
        if not ranges:
            return 0
        from_ranges, params = base.ranges_table(ranges)
        cur.execute(
            sql.SQL(
                "DELETE FROM {} t USING " + from_ranges + " r WHERE t.kafka_topic = r.topic"
                " AND t.kafka_partition = r.partition AND t.kafka_offset >= r.from_offset AND t.kafka_offset < r.until_offset"
            ).format(self._target),
            params,
        )
        return cur.rowcount

    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: StagedRows) -> int:
        """Per record key: the row now and the row after the replay (null: absent)."""
        staged = sql.Identifier(STAGE_SCHEMA, result.stage)
        values = [c.name for c in self.columns]
        from_ranges, params = base.ranges_table(replaced)
        cur.execute(
            sql.SQL(
                "WITH old AS (SELECT t.* FROM {target} t JOIN " + from_ranges + " r ON t.kafka_topic = r.topic"
                "  AND t.kafka_partition = r.partition AND t.kafka_offset >= r.from_offset"
                "  AND t.kafka_offset < r.until_offset)"
                " INSERT INTO kafka_batch.replay_previews (batch_id, target, group_key, before, after)"
                " SELECT %s, %s, CASE WHEN old.kafka_offset IS NULL THEN {new_key} ELSE {old_key} END,"
                "  CASE WHEN old.kafka_offset IS NULL THEN NULL ELSE {old_values} END,"
                "  CASE WHEN new.kafka_offset IS NULL THEN NULL ELSE {new_values} END"
                " FROM old FULL OUTER JOIN {staged} new ON {match}"
                " WHERE old.kafka_offset IS NULL OR new.kafka_offset IS NULL OR ({old_cols}) IS DISTINCT FROM ({new_cols})"
            ).format(
                target=self._target, staged=staged, new_key=base.as_json("new", KEY), old_key=base.as_json("old", KEY),
                old_values=base.as_json("old", values), new_values=base.as_json("new", values), match=base.same(KEY, "old", "new"),
                old_cols=base.names(values, "old") if values else sql.SQL("1"),
                new_cols=base.names(values, "new") if values else sql.SQL("1"),
            ),
            (*params, batch_id, self.table),
        )
        changed = cur.rowcount
        cur.execute(sql.SQL("DROP TABLE {}").format(staged))
        return changed

    def discard(self, cur, batch_id: int, attempt: int | None) -> None:
        pattern = self.stage_name(batch_id, attempt) if attempt is not None else f"b{batch_id}\\_a%\\_{self.kind}"
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s", (STAGE_SCHEMA, pattern))
        for (name,) in cur.fetchall():
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(STAGE_SCHEMA, name)))


def stage_rows(postgres: dict, table: str, columns: list[str]):
    """The executor side: COPY a task's rows in one transaction, yield its counts per range.

    A retried Spark task first deletes what an earlier try of the same task may have committed.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg2
        from pyspark import TaskContext

        context = TaskContext.get()
        retry = context is not None and context.attemptNumber() > 0
        counts = {"records": Counter(), "tombstones": Counter(), "invalid": Counter()}
        target = sql.Identifier(STAGE_SCHEMA, table)
        conn = psycopg2.connect(**postgres)
        try:
            with conn, conn.cursor() as cur:
                if retry:
                    cur.execute(sql.SQL("CREATE TEMP TABLE task_rows ON COMMIT DROP AS SELECT * FROM {} WITH NO DATA")
                                .format(target))
                into = sql.Identifier("task_rows") if retry else target
                for batch in batches:
                    skipped = pc.or_(batch.column("_tombstone"), batch.column("_invalid"))
                    masks = {"tombstones": batch.column("_tombstone"), "invalid": batch.column("_invalid"),
                             "records": pc.invert(skipped)}
                    for what, mask in masks.items():
                        for range_id, n in zip(*_count_by(batch.column("range_id"), mask), strict=True):
                            counts[what][range_id] += n
                    rows = batch.filter(masks["records"])
                    if rows.num_rows:
                        base.copy_arrow(cur, into, rows.select(columns))
                if retry:
                    cur.execute(sql.SQL(
                        "DELETE FROM {t} s USING task_rows n WHERE {match}; INSERT INTO {t} SELECT * FROM task_rows"
                    ).format(t=target, match=base.same(KEY, "s", "n")))
        finally:
            conn.close()
        range_ids = sorted(set().union(*counts.values()))
        yield pa.RecordBatch.from_pydict({
            "range_id": pa.array(range_ids, pa.int64()),
            **{what: pa.array([c[r] for r in range_ids], pa.int64()) for what, c in counts.items()},
        })

    return write


def _count_by(range_ids: pa.Array, mask: pa.Array) -> tuple[list[int], list[int]]:
    """(range ids, how many rows of each), over the rows where `mask` is true."""
    range_ids = range_ids.filter(mask)
    if len(range_ids) == 0:
        return [], []
    counted = pc.value_counts(range_ids)
    return counted.field("values").to_pylist(), counted.field("counts").to_pylist()
