"""The commit: positions, aggregates, data loss and batch status in ONE Postgres transaction.

A replay instead swaps the contributions of the committed ranges it recomputes and moves no position.
Every range of a batch moves its position by compare-and-set (`next_offset = from` -> `until`); a range whose
stored position is not its `from` rolls the whole transaction back, so a batch can neither leave a
gap nor count a record twice. Results arrive by COPY into a temporary table and are merged inside
the same transaction, so nothing becomes visible before the positions move.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg2 import sql

from kafka_batch.config import Pipeline
from kafka_batch.offset_store import BatchError, lock_pipeline, select_batch, transaction
from kafka_batch.planner import OffsetRange


class CommitConflict(BatchError):
    """A range's from-offset is not the stored position: the batch would leave a gap or repeat records."""


class FencedAttempt(BatchError):
    """A newer attempt (or a newer plan) owns the batch; this one must not commit."""


@dataclass(frozen=True)
class RangeCounts:
    records: int = 0
    tombstones: int = 0


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    already_committed: bool
    records: int
    contribution_rows: int


def _move_position(cur, pipeline_name: str, batch_id: int, r: OffsetRange) -> None:
    cur.execute(
        "UPDATE kafka_batch.offsets SET next_offset = %s, updated_at = now(), batch_id = %s"
        " WHERE pipeline = %s AND topic = %s AND partition = %s AND next_offset = %s",
        (r.until_offset, batch_id, pipeline_name, r.topic, r.partition, r.from_offset),
    )
    if cur.rowcount == 1:
        return
    cur.execute(
        "SELECT next_offset FROM kafka_batch.offsets WHERE pipeline = %s AND topic = %s AND partition = %s",
        (pipeline_name, r.topic, r.partition),
    )
    row = cur.fetchone()
    stored = "no stored position" if row is None else f"stored position {row[0]}"
    raise CommitConflict(
        f"batch {batch_id}: range {r} expected position {r.from_offset} but found {stored}; "
        "another batch moved this partition, nothing was committed"
    )


def _ident(names: list[str], side: str | None = None) -> sql.Composable:
    """`a, b` or, with a side (a table alias), `side.a, side.b`."""
    if side is None:
        return sql.SQL(", ").join(map(sql.Identifier, names))
    return sql.SQL(", ").join(sql.Identifier(side, n) for n in names)


def _sums(measures: list[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.SQL("sum({m}) AS {m}").format(m=sql.Identifier(m)) for m in measures)


def _same_keys(keys: list[str], left: str, right: str) -> sql.Composable:
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(left, k), sql.Identifier(right, k)) for k in keys)


def _contributions(pipeline: Pipeline) -> sql.Composable:
    schema, by_range = pipeline.contributions_table.split(".")
    return sql.Identifier(schema, by_range)


def _stage(cur, pipeline: Pipeline, contributions: pa.Table) -> list[str]:
    """COPY rows of (range_id, keys..., measures...) into a temporary table dropped at commit."""
    columns = ["range_id"] + [c.name for c in pipeline.group_by + pipeline.measures]
    cur.execute(
        sql.SQL("CREATE TEMP TABLE kafka_batch_stage ON COMMIT DROP AS SELECT * FROM {} WITH NO DATA").format(
            _contributions(pipeline)
        )
    )
    buffer = io.BytesIO()
    pacsv.write_csv(contributions.select(columns), buffer, pacsv.WriteOptions(include_header=False))
    buffer.seek(0)
    cur.copy_expert(
        sql.SQL("COPY kafka_batch_stage ({}) FROM STDIN WITH (FORMAT csv)").format(_ident(columns)).as_string(cur),
        buffer,
    )
    return columns


def _merge_contributions(cur, pipeline: Pipeline, contributions: pa.Table) -> int:
    """Keep each range's contribution and add them to the totals."""
    if contributions.num_rows == 0:
        return 0
    columns = _stage(cur, pipeline, contributions)
    keys = [c.name for c in pipeline.group_by]
    measures = [c.name for c in pipeline.measures]
    cur.execute(
        sql.SQL("INSERT INTO {} ({cols}) SELECT {cols} FROM kafka_batch_stage").format(
            _contributions(pipeline), cols=_ident(columns)
        )
    )
    cur.execute(
        sql.SQL(
            "INSERT INTO public.{table} ({keys}, {measures}) SELECT {keys}, {sums} FROM kafka_batch_stage GROUP BY {keys}"
            " ON CONFLICT ({keys}) DO UPDATE SET {updates}"
        ).format(
            table=sql.Identifier(pipeline.table),
            keys=_ident(keys),
            measures=_ident(measures),
            sums=_sums(measures),
            updates=sql.SQL(", ").join(
                sql.SQL("{m} = {table}.{m} + EXCLUDED.{m}").format(m=sql.Identifier(m), table=sql.Identifier(pipeline.table))
                for m in measures
            ),
        )
    )
    return contributions.num_rows


def remove_contributions(cur, pipeline: Pipeline, range_ids: list[int]) -> int:
    """Take the ranges' contributions out of the totals exactly; keys left with none disappear."""
    if not range_ids:
        return 0
    keys = [c.name for c in pipeline.group_by]
    measures = [c.name for c in pipeline.measures]
    table, contributions = sql.Identifier(pipeline.table), _contributions(pipeline)
    cur.execute(
        sql.SQL(
            "CREATE TEMP TABLE kafka_batch_removed ON COMMIT DROP AS SELECT {keys}, {sums} FROM {contributions}"
            " WHERE range_id = ANY(%s) GROUP BY {keys}"
        ).format(keys=_ident(keys), contributions=contributions, sums=_sums(measures)),
        (range_ids,),
    )
    cur.execute(sql.SQL("DELETE FROM {} WHERE range_id = ANY(%s)").format(contributions), (range_ids,))
    removed = cur.rowcount
    cur.execute(
        sql.SQL("UPDATE public.{table} t SET {updates} FROM kafka_batch_removed r WHERE {match}").format(
            table=table,
            updates=sql.SQL(", ").join(sql.SQL("{m} = t.{m} - r.{m}").format(m=sql.Identifier(m)) for m in measures),
            match=_same_keys(keys, "t", "r"),
        )
    )
    cur.execute(
        sql.SQL(
            "DELETE FROM public.{table} t USING kafka_batch_removed r WHERE {match}"
            " AND NOT EXISTS (SELECT 1 FROM {contributions} c WHERE {still})"
        ).format(table=table, match=_same_keys(keys, "t", "r"), contributions=contributions,
                 still=_same_keys(keys, "c", "t"))
    )
    cur.execute("DROP TABLE kafka_batch_removed")
    return removed


def retire_ranges(cur, pipeline: Pipeline, range_ids: list[int], retired_by: str) -> None:
    """Committed ranges leave the totals (exactly) and the live ledger; their rows stay, marked why."""
    remove_contributions(cur, pipeline, range_ids)
    cur.execute(
        "UPDATE kafka_batch.batch_ranges SET retired_at = now(), retired_by = %s WHERE id = ANY(%s)",
        (retired_by, range_ids),
    )


def _retire_replaced(cur, pipeline: Pipeline, batch_id: int) -> None:
    """A replay swaps ranges: the ranges it recomputes leave the totals, in its commit transaction."""
    cur.execute(
        "SELECT o.id, o.topic, o.partition, o.from_offset, o.until_offset, o.retired_by"
        " FROM kafka_batch.batch_ranges n JOIN kafka_batch.batch_ranges o ON o.id = n.replaces_range_id"
        " WHERE n.batch_id = %s ORDER BY o.id FOR UPDATE OF o",
        (batch_id,),
    )
    replaced = cur.fetchall()
    for _, topic, partition, from_offset, until_offset, retired_by in replaced:
        if retired_by is not None:
            raise CommitConflict(
                f"replay batch {batch_id}: range {topic}[{partition}] {from_offset}..{until_offset} was retired by "
                f"{retired_by} after the replay was planned; nothing was committed, plan the replay again"
            )
    retire_ranges(cur, pipeline, [row[0] for row in replaced], f"replay batch {batch_id}")


def _current_attempt(cur, pipeline: Pipeline, batch_id: int, attempt: int):
    """Lock the pipeline and the batch; refuse an attempt that is no longer the batch's current one."""
    lock_pipeline(cur, pipeline.name)
    batch = select_batch(cur, "id = %s FOR UPDATE", (batch_id,))
    if batch is None or batch.pipeline != pipeline.name:
        raise BatchError(f"batch {batch_id} does not exist for pipeline {pipeline.name!r}")
    if batch.status == "committed":
        return batch
    if batch.status not in ("planned", "failed"):
        raise FencedAttempt(f"batch {batch_id} is {batch.status} ({batch.error}); it can no longer commit")
    if batch.attempt != attempt:
        raise FencedAttempt(
            f"batch {batch_id}: attempt {attempt} is stale, attempt {batch.attempt} started since; not committing"
        )
    return batch


def preview_replay(conn, pipeline: Pipeline, batch_id: int, attempt: int, contributions: pa.Table) -> int:
    """A replay's dry run: store how the totals would change, per group key, and commit nothing else.

    The batch ends `previewed` (it can never commit); returns how many keys would change.
    """
    keys = [c.name for c in pipeline.group_by]
    measures = [c.name for c in pipeline.measures]
    as_json = lambda side, names: sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(  # noqa: E731
        sql.SQL("{}, {}").format(sql.Literal(n), sql.Identifier(side, n)) for n in names
    ))
    first_key = sql.Identifier(keys[0])
    with transaction(conn) as cur:
        batch = _current_attempt(cur, pipeline, batch_id, attempt)
        if batch.kind != "replay" or batch.status == "committed":
            raise BatchError(f"batch {batch_id} is a {batch.status} {batch.kind}; only a planned replay can be previewed")
        _stage(cur, pipeline, contributions)
        cur.execute(
            sql.SQL(
                "WITH old AS (SELECT {keys}, {sums} FROM {contributions} WHERE range_id IN"
                "  (SELECT replaces_range_id FROM kafka_batch.batch_ranges WHERE batch_id = %(batch)s) GROUP BY {keys}),"
                " new AS (SELECT {keys}, {sums} FROM kafka_batch_stage GROUP BY {keys})"
                " INSERT INTO kafka_batch.replay_previews (batch_id, group_key, before, after)"
                " SELECT %(batch)s, CASE WHEN old.{first} IS NULL THEN {new_key} ELSE {old_key} END,"
                "  CASE WHEN old.{first} IS NULL THEN NULL ELSE {old_measures} END,"
                "  CASE WHEN new.{first} IS NULL THEN NULL ELSE {new_measures} END"
                " FROM old FULL OUTER JOIN new ON {match}"
                " WHERE old.{first} IS NULL OR new.{first} IS NULL OR ({old_cols}) IS DISTINCT FROM ({new_cols})"
            ).format(
                keys=_ident(keys), sums=_sums(measures), contributions=_contributions(pipeline),
                first=first_key, new_key=as_json("new", keys), old_key=as_json("old", keys),
                old_measures=as_json("old", measures), new_measures=as_json("new", measures),
                match=_same_keys(keys, "old", "new"), old_cols=_ident(measures, "old"), new_cols=_ident(measures, "new"),
            ),
            {"batch": batch_id},
        )
        changed = cur.rowcount
        cur.execute("UPDATE kafka_batch.batches SET status = 'previewed', error = NULL WHERE id = %s", (batch_id,))
    return changed


def commit_batch(
    conn,
    pipeline: Pipeline,
    batch_id: int,
    attempt: int,
    contributions: pa.Table,
    counts: dict[int, RangeCounts],
) -> CommitResult:
    """Commit one attempt of a batch. A batch already committed is a no-op success."""
    with transaction(conn) as cur:
        batch = _current_attempt(cur, pipeline, batch_id, attempt)
        if batch.status == "committed":
            return CommitResult(batch_id, True, batch.records_read or 0, 0)
        unknown = set(counts) - {r.range_id for r in batch.ranges}
        if unknown:
            raise BatchError(f"batch {batch_id}: results name ranges {sorted(unknown)} that are not in the batch")
        if batch.kind == "replay":
            _retire_replaced(cur, pipeline, batch_id)
        else:
            for r in batch.ranges:
                _move_position(cur, pipeline.name, batch_id, r)
        rows = _merge_contributions(cur, pipeline, contributions)
        for r in batch.ranges:
            c = counts.get(r.range_id, RangeCounts())
            cur.execute(
                "UPDATE kafka_batch.batch_ranges SET records_read = %s, records_tombstone = %s WHERE id = %s",
                (c.records, c.tombstones, r.range_id),
            )
        cur.execute(
            "INSERT INTO kafka_batch.data_loss"
            " (pipeline, topic, partition, lost_from, lost_until, detected_at, batch_id)"
            " SELECT %s, topic, partition, from_offset, lost_until, lost_detected_at, batch_id"
            " FROM kafka_batch.batch_ranges WHERE batch_id = %s AND lost_until IS NOT NULL"
            " AND replaces_range_id IS NULL",
            (pipeline.name, batch_id),
        )
        records = sum(c.records for c in counts.values())
        cur.execute(
            "UPDATE kafka_batch.batches SET status = 'committed', committed_at = now(), error = NULL,"
            " records_read = %s, records_tombstone = %s WHERE id = %s",
            (records, sum(c.tombstones for c in counts.values()), batch_id),
        )
    return CommitResult(batch_id, False, records, rows)
