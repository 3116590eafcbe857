"""The upsert sink: a table that mirrors each key's latest record, deletes applied, replayable exactly.

`public.<table>` holds, per key, the value columns of its latest committed record, with that record's
version and (topic, partition, offset) of origin; a key whose latest record is a delete (a tombstone,
an envelope's delete event, or `delete_when`) is absent. "Latest" is defined, not accidental: by the
pipeline's `version` expression when it names one (ties broken by topic, partition, offset), otherwise
by (topic, partition, offset), which is the offset order within a partition (right for keyed topics,
where a key lives in one partition).

`kafka_batch.<table>__history` keeps, per committed range and key, the latest record of the key in that
range, deletes included. The table is always the latest history row per key, which is what makes the
sink exact: a batch adds its ranges' rows and sets only the keys whose latest row is new (an older
version arriving late changes nothing, and a remembered delete keeps an older record from bringing a
key back); removing ranges (replay, rewind) deletes their rows and sets each key they touched to its
latest remaining row. Ranges beyond the replay horizon are folded: per key only the latest of their
rows (and of the base) stays, as range 0, so the history grows with keys and the horizon, not with
every batch. Within a batch Spark keeps the latest record per (range, key); executors stage those rows
(kafka_batch.sinks.staging), and the commit moves them with one INSERT ... ON CONFLICT and one DELETE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from psycopg2 import sql
from pydantic import Field, model_validator

from kafka_batch.errors import StateError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.model import Expression
from kafka_batch.sinks import base, staging
from kafka_batch.sinks.base import (
    Column,
    ColumnSpec,
    SinkOutput,
    StageContext,
    TableSink,
    as_json,
    check_new_ranges,
    create_per_range_table,
    names,
    require_columns,
    same,
)

if TYPE_CHECKING:  # pyarrow where a sink computes (see kafka_batch.sinks)
    import pyarrow as pa

SCHEMA = "kafka_batch"
BASE_RANGE = 0  # the latest rows of every folded range, per key (range ids start at 1)
ORIGIN = (("kafka_topic", "text"), ("kafka_partition", "integer"), ("kafka_offset", "bigint"))
VERSION = "row_version"
RESERVED = {"range_id", "deleted", VERSION, *(name for name, _ in ORIGIN)}


class VersionSpec(ColumnSpec):
    """What orders a key's records: a newer version wins, whatever the offsets say."""

    type: Literal["bigint", "integer", "double precision", "timestamptz", "date", "text"] = "bigint"
    """The Postgres type of the version (default bigint: Debezium's `source.lsn` and `ts_ms` are numbers)."""


class UpsertSink(TableSink):
    """Each key's latest record (deletes applied): `sinks: {upsert: {table, key, columns, version, delete_when}}`."""

    kind = "upsert"
    keyed = True
    key: base.columns(ColumnSpec)
    """The key: its columns make the table's primary key (a record where one is null is invalid)."""
    columns: base.columns(ColumnSpec) = Field(default_factory=tuple)
    """The value columns, from the key's latest record."""
    version: base.spec_or_expression(VersionSpec) | None = None
    """Orders a key's records (e.g. `updated_at`, Debezium's `source.lsn`): a record older than the stored
    row is ignored. Ties break by (topic, partition, offset). Default: (topic, partition, offset), the
    offset order within a partition. With a version, a tombstone deletes only when the expression gives
    it one (e.g. `timestamp`)."""
    delete_when: Expression | None = None
    """A Spark SQL condition marking more records as deletes of their key (a tombstone and a Debezium
    `op = 'd'` always are)."""

    @model_validator(mode="after")
    def _names(self) -> UpsertSink:
        names_ = [c.name for c in self.key + self.columns]
        duplicated = sorted({n for n in names_ if names_.count(n) > 1})
        if duplicated:
            raise ValueError(f"column(s) {duplicated} defined twice (in key and columns)")
        reserved = sorted(set(names_) & RESERVED)
        if reserved:
            raise ValueError(f"column name(s) {reserved} are reserved (the row's version and origin)")
        return self

    @property
    def required_columns(self) -> tuple[Column, ...]:
        return self.key + ((self._version,) if self.version else ())

    @property
    def columns_used(self) -> tuple[Column, ...]:
        return tuple(column for _, column in self.expressions())

    def expressions(self) -> tuple[tuple[str, Column], ...]:
        version = (("version", self._version),) if self.version else ()
        delete_when = (("delete_when", Column("_delete_when", self.delete_when, "boolean")),) if self.delete_when else ()
        return base.at("key", self.key) + version + base.at("columns", self.columns) + delete_when

    @property
    def _version(self) -> Column:
        return Column(VERSION, self.version.expr, self.version.type)

    @property
    def keys(self) -> list[str]:
        return [c.name for c in self.key]

    @property
    def values(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def order(self) -> list[str]:
        """What "latest" compares, most significant first."""
        return [*([VERSION] if self.version else []), *(name for name, _ in ORIGIN)]

    @property
    def history_columns(self) -> list[str]:
        return ["range_id", *self.keys, "deleted", *self.order, *self.values]

    @property
    def table_columns(self) -> list[str]:
        return [*self.keys, *self.values, *self.order]

    @property
    def history_name(self) -> str:
        return f"{self.table}__history"

    @property
    def _target(self) -> sql.Composable:
        return sql.Identifier("public", self.table)

    @property
    def _history(self) -> sql.Composable:
        return sql.Identifier(SCHEMA, self.history_name)

    def _types(self) -> dict[str, str]:
        types = {c.name: c.type for c in self.key + self.columns}
        types.update({VERSION: self.version.type} if self.version else {})
        return {**types, **dict(ORIGIN), "range_id": "bigint", "deleted": "boolean"}

    def create(self, cur, pipeline_name: str) -> None:
        types = self._types()
        catalog = {c.name: c.catalog_type for c in self.key + self.columns}
        catalog.update({VERSION: self._version.catalog_type} if self.version else {})

        def expected(columns: list[str]) -> list[tuple[str, str]]:
            return [(n, catalog.get(n, types[n])) for n in columns]

        exist = [require_columns(cur, pipeline_name, "public", self.table, expected(self.table_columns)),
                 require_columns(cur, pipeline_name, SCHEMA, self.history_name, expected(self.history_columns))]
        if all(exist):
            return

        def defs(columns: list[str]) -> sql.Composable:
            nullable = set(self.values)
            return sql.SQL(", ").join(sql.SQL("{} {}{}").format(
                sql.Identifier(n), sql.SQL(types[n]), sql.SQL("" if n in nullable else " NOT NULL")) for n in columns)

        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            self._target, defs(self.table_columns), names(self.keys)))
        create_per_range_table(cur, SCHEMA, self.history_name, defs(self.history_columns), self.keys)

    def compute(self, records, stage: StageContext) -> SinkOutput:
        """One Spark pass: per (range, key) the latest record (deduplicated by the executors, never the
        driver), staged by the executors; only counts reach the driver."""
        from pyspark.sql import functions as F

        valid = F.col("_invalid").isNull()
        keys = [F.expr(c.expr).cast(c.spark_type) for c in self.key]
        deleted = F.col("_deleted")
        if self.delete_when:
            deleted = deleted | F.coalesce(F.expr(self.delete_when).cast("boolean"), F.lit(False))
        order = [F.expr(self.version.expr).cast(self._version.spark_type).alias(VERSION)] if self.version else []
        order += [F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
                  F.col("offset").alias("kafka_offset")]
        known = [k.isNotNull() for k in keys] + ([order[0].isNotNull()] if self.version else [])
        applies = valid
        for condition in known:  # a tombstone whose key (or version) cannot be computed deletes nothing
            applies = applies & condition
        # A struct compares field by field: the order columns first, and (topic, partition, offset) is unique.
        record = F.struct(*order, deleted.alias("deleted"),
                          *[F.expr(c.expr).cast(c.spark_type).alias(c.name) for c in self.columns])
        grouped = (
            records.groupBy("range_id", *[F.when(applies, k).alias(c.name) for k, c in zip(keys, self.key, strict=True)])
            .agg(F.max(F.when(applies, record)).alias("_latest"),
                 F.sum((~F.col("_tombstone") & valid).cast("long")).alias("records"),
                 F.sum(F.col("_tombstone").cast("long")).alias("tombstones"),
                 F.sum((~valid).cast("long")).alias("invalid"))
            .select("range_id", *self.keys, "_latest.*", "records", "tombstones", "invalid")
        )
        name = staging.create_stage(stage.postgres, stage.batch_id, stage.attempt, self.kind, self._history)
        key = ["range_id", *self.keys]
        report = base.collect_arrow(grouped.mapInArrow(
            staging.stage_task(stage.postgres, name, key, self.history_columns, latest_to_stage), staging.REPORT_SCHEMA))
        counts, staged = staging.reported(report, name)
        return SinkOutput(counts, staged)

    def _parts(self, **more) -> dict:
        types = self._types()
        descending = sql.SQL(", ").join(
            sql.SQL("{} COLLATE \"C\" DESC" if types[n] == "text" else "{} DESC").format(sql.Identifier(n))
            for n in self.order)
        return {"target": self._target, "history": self._history, "keys": names(self.keys), "latest_first": descending,
                "table_columns": names(self.table_columns), "history_columns": names(self.history_columns),
                "set": sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c))
                                          for c in self.values + self.order), **more}

    def _set_keys(self, cur, latest: str, keys: str | None = None) -> int:
        """Make the table hold, for each key in `latest` (the latest history row of some keys), that row;
        with `keys` (a table of keys), a key of it with no row in `latest` leaves the table too. Returns
        the table rows deleted or written."""
        parts = self._parts(latest=sql.Identifier(latest))
        gone = sql.SQL("DELETE FROM {target} t USING {latest} l WHERE {match} AND l.deleted").format(
            match=same(self.keys, "t", "l"), **parts)
        if keys is not None:
            gone = sql.SQL(
                "DELETE FROM {target} t USING {keys_table} k WHERE {match}"
                " AND NOT EXISTS (SELECT 1 FROM {latest} l WHERE {live} AND NOT l.deleted)"
            ).format(keys_table=sql.Identifier(keys), match=same(self.keys, "t", "k"), live=same(self.keys, "l", "t"),
                     **parts)
        cur.execute(gone)
        deleted = cur.rowcount
        cur.execute(sql.SQL("INSERT INTO {target} ({table_columns}) SELECT {table_columns} FROM {latest} WHERE NOT deleted"
                            " ON CONFLICT ({keys}) DO UPDATE SET {set}").format(**parts))
        return deleted + cur.rowcount

    def _latest_of(self, cur, name: str, source: sql.Composable, keys: sql.Composable) -> None:
        """A temporary table of the latest row per key, over `source` rows whose key is in `keys`."""
        cur.execute(sql.SQL(
            "CREATE TEMP TABLE {name} ON COMMIT DROP AS SELECT DISTINCT ON ({keys}) {history_columns} FROM {source} h"
            " WHERE ({keys}) IN (SELECT {keys} FROM {key_source}) ORDER BY {keys}, {latest_first}"
        ).format(name=sql.Identifier(name), source=source, key_source=keys, **self._parts()))

    def apply(self, cur, result: staging.StagedRows) -> int:
        """Add the batch's latest rows per (range, key) to the history and set the keys whose latest row
        is now one of them; returns the table rows written or deleted."""
        staged = staging.staged(result.stage)
        cur.execute(sql.SQL("ANALYZE {}").format(staged))
        cur.execute(sql.SQL("SELECT array_agg(DISTINCT range_id) FROM {}").format(staged))
        range_ids = cur.fetchone()[0] or []
        if range_ids:
            check_new_ranges(cur, self._history, range_ids, f"upsert {self.table}")
        parts = self._parts(staged=staged)
        cur.execute(sql.SQL("INSERT INTO {history} ({history_columns}) SELECT {history_columns} FROM {staged}"
                            " ORDER BY {keys}").format(**parts))
        if cur.rowcount != result.rows:
            raise StateError(f"upsert {self.table}: {cur.rowcount} rows staged for {result.rows} reported in"
                             f" {result.stage}; nothing was committed")
        cur.execute("SET LOCAL work_mem = '64MB'")
        self._latest_of(cur, "upsert_latest", self._history, staged)
        # Keys whose latest row is older than this batch keep the row they have (the version guard).
        cur.execute("DELETE FROM upsert_latest WHERE NOT (range_id = ANY(%s))", (range_ids,))
        cur.execute("ANALYZE upsert_latest")
        cur.execute("SELECT count(*) FROM upsert_latest")
        (changed,) = cur.fetchone()
        self._set_keys(cur, "upsert_latest")
        cur.execute("DROP TABLE upsert_latest")
        cur.execute(sql.SQL("DROP TABLE {}").format(staged))
        return changed

    def remove(self, cur, ranges: Sequence[OffsetRange]) -> int:
        """Take the ranges' rows out of the history; each key they touched falls back to its latest
        remaining row, or leaves the table if it has none or that row is a delete. Returns the table rows
        changed."""
        range_ids = [r.range_id for r in ranges]
        if not range_ids:
            return 0
        parts = self._parts()
        cur.execute(sql.SQL("CREATE TEMP TABLE upsert_touched ON COMMIT DROP AS SELECT DISTINCT {keys} FROM {history}"
                            " WHERE range_id = ANY(%s)").format(**parts), (range_ids,))
        cur.execute(sql.SQL("DELETE FROM {history} WHERE range_id = ANY(%s)").format(**parts), (range_ids,))
        cur.execute("ANALYZE upsert_touched")
        self._latest_of(cur, "upsert_latest", self._history, sql.Identifier("upsert_touched"))
        changed = self._set_keys(cur, "upsert_latest", keys="upsert_touched")
        cur.execute("DROP TABLE upsert_latest, upsert_touched")
        return changed

    def fold(self, cur, range_ids: Sequence[int]) -> None:
        """Per key of the ranges, keep only the latest of their rows and the base's, as the base: the
        table stays as it is, and a remembered delete stays remembered."""
        if not range_ids:
            return
        ids = [BASE_RANGE, *range_ids]
        parts = self._parts()
        cur.execute(sql.SQL("CREATE TEMP TABLE upsert_folded_keys ON COMMIT DROP AS SELECT DISTINCT {keys}"
                            " FROM {history} WHERE range_id = ANY(%s)").format(**parts), (list(range_ids),))
        source = sql.SQL("(SELECT * FROM {} WHERE range_id = ANY({}))").format(self._history, sql.Literal(ids))
        self._latest_of(cur, "upsert_folded", source, sql.Identifier("upsert_folded_keys"))
        cur.execute(sql.SQL("DELETE FROM {history} h USING upsert_folded_keys k WHERE h.range_id = ANY(%s) AND {match}")
                    .format(match=same(self.keys, "h", "k"), **parts), (ids,))
        cur.execute("UPDATE upsert_folded SET range_id = %s", (BASE_RANGE,))
        cur.execute(sql.SQL("INSERT INTO {history} ({history_columns}) SELECT {history_columns} FROM upsert_folded")
                    .format(**parts))
        cur.execute("DROP TABLE upsert_folded, upsert_folded_keys")

    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: staging.StagedRows) -> int:
        """Per key the replay touches: the row now and the row after it (null: absent)."""
        staged = staging.staged(result.stage)
        replaced_ids = [r.range_id for r in replaced]
        parts = self._parts(staged=staged)
        cur.execute(sql.SQL(
            "CREATE TEMP TABLE upsert_touched ON COMMIT DROP AS SELECT {keys} FROM {history} WHERE range_id = ANY(%s)"
            " UNION SELECT {keys} FROM {staged}").format(**parts), (replaced_ids,))
        source = sql.SQL("(SELECT {cols} FROM {history} WHERE NOT (range_id = ANY({ids})) UNION ALL"
                         " SELECT {cols} FROM {staged})").format(cols=names(self.history_columns),
                                                                 ids=sql.Literal(replaced_ids), **parts)
        self._latest_of(cur, "upsert_after", source, sql.Identifier("upsert_touched"))
        shown = self.values + self.order
        cur.execute(sql.SQL(
            "INSERT INTO kafka_batch.replay_previews (batch_id, target, group_key, before, after)"
            " SELECT %s, %s, {key}, CASE WHEN t.{first} IS NULL THEN NULL ELSE {before} END,"
            "  CASE WHEN a.deleted IS DISTINCT FROM false THEN NULL ELSE {after} END"
            " FROM upsert_touched k LEFT JOIN {target} t ON {at_t} LEFT JOIN upsert_after a ON {at_a}"
            " WHERE (CASE WHEN t.{first} IS NULL THEN NULL ELSE {before} END)"
            "  IS DISTINCT FROM (CASE WHEN a.deleted IS DISTINCT FROM false THEN NULL ELSE {after} END)"
        ).format(key=as_json("k", self.keys), first=sql.Identifier(self.keys[0]), before=as_json("t", shown),
                 after=as_json("a", shown), at_t=same(self.keys, "t", "k"), at_a=same(self.keys, "a", "k"), **parts),
            (batch_id, self.table))
        changed = cur.rowcount
        cur.execute(sql.SQL("DROP TABLE upsert_after, upsert_touched, {staged}").format(**parts))
        return changed

    def discard(self, cur, batch_id: int, attempt: int | None) -> None:
        staging.discard(cur, batch_id, attempt, self.kind)


def latest_to_stage(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.Table]:
    """A task's (range, key) groups: those with a latest record are staged; every group's counts count."""
    import pyarrow.compute as pc
    counts = staging.per_range(batch.column("range_id"), *(batch.column(c) for c in staging.COUNTS))
    return batch.filter(pc.is_valid(batch.column("deleted"))), counts
