"""The aggregate sink: additive measures per group key, with each range's contribution kept.

Totals live in `public.<table>`; what every committed range added lives in
`kafka_batch.<table>__by_range`, which is what makes removing a range's effect exact (replay, rewind).
Measures must be additive (sums), so contributions can be added and subtracted. Ranges beyond the
pipeline's replay horizon are folded: their contributions merge into the base rows (range id 0), so
the table grows with the keys and the horizon, not with every batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg2 import sql
from pydantic import model_validator

from kafka_batch.errors import StateError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.sinks.base import (
    Column,
    ColumnSpec,
    MeasureSpec,
    SinkOutput,
    StageContext,
    TableSink,
    as_json,
    at,
    check_new_ranges,
    collect_arrow,
    columns,
    copy_arrow,
    create_per_range_table,
    names,
    range_counts,
    require_columns,
    same,
)

if TYPE_CHECKING:  # pyarrow where a sink computes (see kafka_batch.sinks)
    import numpy as np
    import pyarrow as pa

SCHEMA = "kafka_batch"
BASE_RANGE = 0  # the contributions of every folded range, per key (range ids start at 1)
_ADDED = sql.Identifier("aggregate_added")  # a commit's sums per key over several ranges (temporary)


def _sums(measures: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.SQL("sum({m}) AS {m}").format(m=sql.Identifier(m)) for m in measures)


class AggregateSink(TableSink):
    """Additive measures per group key: `sinks: {aggregate: {table, group_by, measures}}`."""

    kind = "aggregate"
    keyed = True
    group_by: columns(ColumnSpec)
    """The group key: its columns make the table's primary key (a record where one is null is invalid)."""
    measures: columns(MeasureSpec)
    """What is summed per key (default type bigint); a count is `{expr: "1"}`."""

    @model_validator(mode="after")
    def _distinct_names(self) -> AggregateSink:
        names = [c.name for c in self.group_by + self.measures]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"column(s) {duplicated} defined twice (in group_by and measures)")
        if "range_id" in names:
            raise ValueError("column name 'range_id' is reserved")
        return self

    @property
    def required_columns(self) -> tuple[Column, ...]:
        return self.group_by

    @property
    def columns_used(self) -> tuple[Column, ...]:
        return self.group_by + self.measures

    def expressions(self) -> tuple[tuple[str, Column], ...]:
        return at("group_by", self.group_by) + at("measures", self.measures)

    @property
    def keys(self) -> list[str]:
        return [c.name for c in self.group_by]

    @property
    def measure_names(self) -> list[str]:
        return [c.name for c in self.measures]

    @property
    def contributions_name(self) -> str:
        return f"{self.table}__by_range"

    @property
    def _totals(self) -> sql.Composable:
        return sql.Identifier("public", self.table)

    @property
    def _contributions(self) -> sql.Composable:
        return sql.Identifier(SCHEMA, self.contributions_name)

    def create(self, cur, pipeline_name: str) -> None:
        columns = [(c.name, c.catalog_type) for c in self.group_by + self.measures]
        exist = [require_columns(cur, pipeline_name, "public", self.table, columns),
                 require_columns(cur, pipeline_name, SCHEMA, self.contributions_name, [("range_id", "bigint"), *columns])]
        if all(exist):
            return
        defs = sql.SQL(", ").join(
            sql.SQL("{} {} NOT NULL").format(sql.Identifier(c.name), sql.SQL(c.type)) for c in self.group_by + self.measures
        )
        keys = names(self.keys)
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(self._totals, defs, keys))
        create_per_range_table(cur, SCHEMA, self.contributions_name, sql.SQL("range_id bigint NOT NULL, {}").format(defs))

    def compute(self, records, stage: StageContext) -> SinkOutput:
        """One Spark pass: per (range, group key) the measures, records and tombstones; then to the driver."""
        from pyspark.sql import functions as F

        valid = ~F.col("_tombstone") & F.col("_invalid").isNull()
        # Tombstones and invalid records form a group of null keys with no records: counted, not contributions.
        keys = [F.when(valid, F.expr(c.expr).cast(c.spark_type)).alias(f"__key_{c.name}") for c in self.group_by]
        measures = [F.when(valid, F.expr(c.expr).cast(c.spark_type)).alias(f"__measure_{c.name}")
                    for c in self.measures]
        result = collect_arrow(
            records.select("range_id", valid.alias("_valid"), "_tombstone", "_invalid", *keys, *measures)
            .groupBy("range_id", *[F.col(f"__key_{c.name}").alias(c.name) for c in self.group_by])
            .agg(
                *[F.coalesce(F.sum(f"__measure_{c.name}"), F.lit(0)).cast(c.spark_type).alias(c.name)
                  for c in self.measures],
                F.sum(F.col("_valid").cast("long")).alias("records"),
                F.sum(F.col("_tombstone").cast("long")).alias("tombstones"),
                F.sum(F.col("_invalid").isNotNull().cast("long")).alias("invalid"),
            )
        )
        return SinkOutput(range_counts(result), contributions(result, self.keys + self.measure_names))

    def _stage(self, cur, contributions: pa.Table) -> None:
        """COPY (range_id, keys..., measures...) into a temporary table dropped at commit."""
        cur.execute(sql.SQL("CREATE TEMP TABLE aggregate_stage ON COMMIT DROP AS SELECT * FROM {} WITH NO DATA").format(
            self._contributions
        ))
        copy_arrow(cur, sql.Identifier("aggregate_stage"), contributions)

    def _key_starts(self, rows: pa.Table) -> np.ndarray | None:
        """What a key would check row by row, once for the whole result sorted by key and range: one row
        per (range, key). Returns where each key's rows begin if some key has rows in several ranges (its
        measures need adding up), else None."""
        import numpy as np
        import pyarrow.compute as pc
        if rows.num_rows < 2:
            return None
        following = [pc.equal(rows[c].slice(1), rows[c].slice(0, rows.num_rows - 1)) for c in self.keys]
        same_key = following[0]
        for equal in following[1:]:
            same_key = pc.and_(same_key, equal)
        same_range = pc.equal(rows["range_id"].slice(1), rows["range_id"].slice(0, rows.num_rows - 1))
        duplicates = pc.sum(pc.and_(same_key, same_range)).as_py() or 0
        if duplicates:
            raise StateError(f"aggregate {self.table}: {duplicates} duplicate (range, key) rows; nothing was committed")
        if not pc.any(same_key).as_py():
            return None
        return np.concatenate([[0], np.flatnonzero(~same_key.to_numpy()) + 1])

    def apply(self, cur, result: pa.Table) -> int:
        """Keep each range's contribution (COPYed straight in) and add them to the totals with one MERGE;
        returns the totals' rows it changed.

        The commit holds the pipeline's lock, so no other writer touches the totals meanwhile. Rows
        reach the totals in key order (`_added`), so the primary key is filled page after page instead
        of at random (1M new keys: 1.2 s instead of 2.9 s). The planner has no statistics on rows this
        transaction added, so it estimates few and probes the totals' primary key per key (right for a
        large table); a small table it hashes instead.
        """
        import pyarrow.compute as pc
        if result.num_rows == 0:
            return 0
        keys, measures = self.keys, self.measure_names
        range_ids = pc.unique(result["range_id"]).to_pylist()
        rows = result.select(["range_id", *keys, *measures]).sort_by(
            [(k, "ascending") for k in keys] + [("range_id", "ascending")])
        starts = self._key_starts(rows)
        check_new_ranges(cur, self._contributions, range_ids, f"aggregate {self.table}")
        copy_arrow(cur, self._contributions, rows)
        added, params = self._added(cur, rows, range_ids, starts)
        cur.execute(sql.SQL(
            "MERGE INTO {totals} t USING {added} a ON {match}"
            " WHEN MATCHED THEN UPDATE SET {updates}"
            " WHEN NOT MATCHED THEN INSERT ({keys}, {measures}) VALUES ({new})").format(
                totals=self._totals, added=added, match=same(keys, "t", "a"), keys=names(keys),
                measures=names(measures), new=names(keys + measures, "a"),
                updates=sql.SQL(", ").join(sql.SQL("{m} = t.{m} + a.{m}").format(m=sql.Identifier(m))
                                           for m in measures)), params)
        changed = cur.rowcount  # the totals' rows the MERGE inserted or updated
        if added == _ADDED:
            cur.execute(sql.SQL("DROP TABLE {}").format(_ADDED))  # another aggregate sink may commit next
        return changed

    def _added(self, cur, rows: pa.Table, range_ids: list[int],
               starts: np.ndarray | None) -> tuple[sql.Composable, tuple | None]:
        """What the MERGE adds per key, and its parameters. Where each key has one range, the rows just
        COPYed, in their (key) order. Else their sums per key, added up here in key order into a temporary
        table; or, where an integer sum could pass bigint's bounds, by Postgres (exactly, in numeric, but
        its GROUP BY hashes the keys into random order)."""
        keys, measures = self.keys, self.measure_names
        if starts is None:
            return sql.SQL("(SELECT {} FROM {} WHERE range_id = ANY(%s))").format(
                names(keys + measures), self._contributions), (range_ids,)
        sums = self._summed(rows, starts, len(range_ids))
        if sums is None:
            cur.execute("SET LOCAL work_mem = '64MB'")
            return sql.SQL("(SELECT {keys}, {sums} FROM {contributions} WHERE range_id = ANY(%s) GROUP BY {keys})").format(
                keys=names(keys), sums=_sums(measures), contributions=self._contributions), (range_ids,)
        cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
                    .format(_ADDED, names(keys + measures), self._totals))
        copy_arrow(cur, _ADDED, sums)
        return _ADDED, None

    def _summed(self, rows: pa.Table, starts: np.ndarray, ranges: int) -> pa.Table | None:
        """Per key, in the order of `rows` (sorted by key; `starts`: where each key's rows begin), its
        measures summed over its ranges; None where an integer sum could pass bigint's bounds, as
        numpy's integer sums wrap around silently."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        keys, measures = self.keys, self.measure_names
        for m in measures:
            if pa.types.is_integer(rows[m].type):
                bounds = pc.min_max(rows[m])
                if max(abs(bounds["min"].as_py() or 0), abs(bounds["max"].as_py() or 0)) * ranges >= 2**63:
                    return None
        first = pa.array(starts)
        return pa.Table.from_arrays([*[rows[k].take(first) for k in keys],
                                     *[pa.array(np.add.reduceat(rows[m].to_numpy(), starts), rows[m].type)
                                       for m in measures]],
                                    names=keys + measures)

    def remove(self, cur, ranges: Sequence[OffsetRange]) -> int:
        """Take the ranges' contributions out of the totals exactly; keys left with none disappear.
        Returns the totals rows changed (updated, or deleted with them)."""
        range_ids = [r.range_id for r in ranges]
        if not range_ids:
            return 0
        keys, measures = self.keys, self.measure_names
        cur.execute(
            sql.SQL(
                "CREATE TEMP TABLE aggregate_removed ON COMMIT DROP AS SELECT {keys}, {sums} FROM {contributions}"
                " WHERE range_id = ANY(%s) GROUP BY {keys}"
            ).format(keys=names(keys), contributions=self._contributions, sums=_sums(measures)),
            (range_ids,),
        )
        cur.execute(sql.SQL("DELETE FROM {} WHERE range_id = ANY(%s)").format(self._contributions), (range_ids,))
        cur.execute(
            sql.SQL("UPDATE {totals} t SET {updates} FROM aggregate_removed r WHERE {match}").format(
                totals=self._totals,
                updates=sql.SQL(", ").join(sql.SQL("{m} = t.{m} - r.{m}").format(m=sql.Identifier(m)) for m in measures),
                match=same(keys, "t", "r"),
            )
        )
        changed = cur.rowcount
        cur.execute(
            sql.SQL(
                "DELETE FROM {totals} t USING aggregate_removed r WHERE {match}"
                " AND NOT EXISTS (SELECT 1 FROM {contributions} c WHERE {still})"
            ).format(totals=self._totals, match=same(keys, "t", "r"), contributions=self._contributions,
                     still=same(keys, "c", "t"))
        )
        cur.execute("DROP TABLE aggregate_removed")
        return changed

    def fold(self, cur, range_ids: Sequence[int]) -> None:
        """Merge the ranges' contributions into the base rows: the totals stay as they are, and a key
        with a base row is never dropped by a later removal (see `remove`)."""
        if not range_ids:
            return
        ids = [BASE_RANGE, *range_ids]
        parts = {"keys": names(self.keys), "sums": _sums(self.measure_names), "contributions": self._contributions}
        cur.execute(sql.SQL(
            "CREATE TEMP TABLE aggregate_folded ON COMMIT DROP AS SELECT {keys}, {sums} FROM {contributions}"
            " WHERE range_id = ANY(%s) GROUP BY {keys}").format(**parts), (ids,))
        cur.execute(sql.SQL("DELETE FROM {contributions} WHERE range_id = ANY(%s)").format(**parts), (ids,))
        cur.execute(sql.SQL("INSERT INTO {contributions} (range_id, {keys}, {measures}) SELECT %s, {keys}, {measures}"
                            " FROM aggregate_folded").format(measures=names(self.measure_names), **parts), (BASE_RANGE,))
        cur.execute("DROP TABLE aggregate_folded")

    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: pa.Table) -> int:
        """Per group key: the measures the replaced ranges contribute now, and what they would."""
        keys, measures = self.keys, self.measure_names
        self._stage(cur, result)
        first = sql.Identifier(keys[0])
        cur.execute(
            sql.SQL(
                "WITH old AS (SELECT {keys}, {sums} FROM {contributions} WHERE range_id = ANY(%(replaced)s) GROUP BY {keys}),"
                " new AS (SELECT {keys}, {sums} FROM aggregate_stage GROUP BY {keys})"
                " INSERT INTO kafka_batch.replay_previews (batch_id, target, group_key, before, after)"
                " SELECT %(batch)s, %(target)s, CASE WHEN old.{first} IS NULL THEN {new_key} ELSE {old_key} END,"
                "  CASE WHEN old.{first} IS NULL THEN NULL ELSE {old_measures} END,"
                "  CASE WHEN new.{first} IS NULL THEN NULL ELSE {new_measures} END"
                " FROM old FULL OUTER JOIN new ON {match}"
                " WHERE old.{first} IS NULL OR new.{first} IS NULL OR ({old_cols}) IS DISTINCT FROM ({new_cols})"
            ).format(
                keys=names(keys), sums=_sums(measures), contributions=self._contributions, first=first,
                new_key=as_json("new", keys), old_key=as_json("old", keys),
                old_measures=as_json("old", measures), new_measures=as_json("new", measures),
                match=same(keys, "old", "new"), old_cols=names(measures, "old"), new_cols=names(measures, "new"),
            ),
            {"batch": batch_id, "target": self.table, "replaced": [r.range_id for r in replaced]},
        )
        changed = cur.rowcount
        cur.execute("DROP TABLE aggregate_stage")
        return changed


def contributions(result: pa.Table, columns: list[str]) -> pa.Table:
    """The rows that are contributions: groups of tombstones only add nothing."""
    import pyarrow.compute as pc
    return result.filter(pc.greater(result["records"], 0)).select(["range_id", *columns])
