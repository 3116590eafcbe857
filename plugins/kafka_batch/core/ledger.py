"""The range ledger: committed ranges with their counts, live until a replay or rewind retires them.

What is live is what the outputs hold now, so any range's effect can be removed exactly. Ranges older
than the replay horizon (config.Replayable) are folded: sinks merge their per-range state, and the
range can no longer be removed on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from kafka_batch.core.batches import RANGE_COLUMNS
from kafka_batch.kafka.ranges import OffsetRange


def live_ranges(cur, pipeline_name: str, topic: str, partition: int) -> list[OffsetRange]:
    """The committed ranges of a partition whose effect is in the outputs now, in offset order."""
    cur.execute(
        f"SELECT {RANGE_COLUMNS} FROM kafka_batch.live_ranges"
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


def record_range_counts(cur, counts: dict) -> None:
    """Per range id, what it held (objects with `records`, `tombstones` and `invalid`); one statement."""
    ids = list(counts)
    cur.execute(
        "UPDATE kafka_batch.batch_ranges b SET records_read = c.records, records_tombstone = c.tombstones,"
        " records_invalid = c.invalid FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::bigint[]) AS records,"
        " unnest(%s::bigint[]) AS tombstones, unnest(%s::bigint[]) AS invalid) c WHERE b.id = c.id",
        (ids, [counts[i].records for i in ids], [counts[i].tombstones for i in ids], [counts[i].invalid for i in ids]),
    )


def record_schema_ids(cur, schema_ids: Mapping[int, Sequence[int]]) -> None:
    """Per range id, the Schema Registry ids of the schemas that wrote its records; one statement."""
    if not schema_ids:
        return
    ids = list(schema_ids)
    cur.execute(
        "UPDATE kafka_batch.batch_ranges b SET schema_ids = c.ids FROM (SELECT unnest(%s::bigint[]) AS id,"
        " unnest(%s::text[])::integer[] AS ids) c WHERE b.id = c.id",
        (ids, ["{" + ",".join(map(str, sorted(schema_ids[i]))) + "}" for i in ids]),
    )
