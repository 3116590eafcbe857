"""The rows sink: every visible record's projected columns, keyed by (topic, partition, offset).

Rows never pass through the driver: each Spark task stages its rows (kafka_batch.sinks.staging), and
the commit transaction moves them into place. Removing ranges deletes their offsets, so replay and
rewind are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg2 import sql
from pydantic import model_validator

from kafka_batch.errors import StateError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.sinks import base, staging
from kafka_batch.sinks.base import SinkOutput, StageContext, TableSink

if TYPE_CHECKING:  # pyarrow where a sink computes (see kafka_batch.sinks)
    import pyarrow as pa

KEY = ("kafka_topic", "kafka_partition", "kafka_offset")
_KEY_TYPES = (("kafka_topic", "text"), ("kafka_partition", "integer"), ("kafka_offset", "bigint"))


class RowsSink(TableSink):
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

    def expressions(self) -> tuple[tuple[str, base.Column], ...]:
        return base.at("columns", self.columns)

    @property
    def column_names(self) -> list[str]:
        return [*KEY, *(c.name for c in self.columns)]

    @property
    def _target(self) -> sql.Composable:
        return sql.Identifier("public", self.table)

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
        """Executors stage their rows (kafka_batch.sinks.staging); only counts reach the driver."""
        from pyspark.sql import functions as F

        name = staging.create_stage(stage.postgres, stage.batch_id, stage.attempt, self.kind, self._target)
        projected = records.select(
            "range_id", "_tombstone", F.col("_invalid").isNotNull().alias("_invalid"),
            F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"),
            *[F.expr(c.expr).cast(c.spark_type).alias(c.name) for c in self.columns],
        )
        report = base.collect_arrow(projected.mapInArrow(
            staging.stage_task(stage.postgres, name, KEY, self.column_names, rows_to_stage), staging.REPORT_SCHEMA))
        counts, staged = staging.reported(report, name)
        return SinkOutput(counts, staged)

    def apply(self, cur, result: staging.StagedRows) -> int:
        """Move the attempt's staged rows into place: the key refuses a record written twice, the count
        a record whose write was lost (a task retry must replace what its killed try wrote, not drop it)."""
        staged = staging.staged(result.stage)
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

    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: staging.StagedRows) -> int:
        """Per record key: the row now and the row after the replay (null: absent)."""
        staged = staging.staged(result.stage)
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
        staging.discard(cur, batch_id, attempt, self.kind)


def rows_to_stage(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.Table]:
    """A task's rows to stage (the records that are neither tombstones nor invalid) and their counts."""
    import pyarrow.compute as pc
    records = pc.invert(pc.or_(batch.column("_tombstone"), batch.column("_invalid")))
    counts = staging.per_range(batch.column("range_id"), records, batch.column("_tombstone"), batch.column("_invalid"))
    return batch.filter(records), counts
