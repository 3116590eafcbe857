"""Positions: per (pipeline, topic, partition), the next offset to read. Written here and nowhere else.

A position is stored once where a partition begins, moved by compare-and-set when a batch commits
(`from` -> `until`, or nothing commits), and moved deliberately only by a recorded reset.
"""

from __future__ import annotations

from kafka_batch.errors import StateError
from kafka_batch.kafka.ranges import OffsetRange


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


def read_epochs(cur, pipeline_name: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(position, the leader epoch at it when it was committed), where a commit stored one."""
    cur.execute(
        "SELECT topic, partition, next_offset, leader_epoch FROM kafka_batch.offsets"
        " WHERE pipeline = %s AND leader_epoch IS NOT NULL", (pipeline_name,)
    )
    return {(topic, partition): (offset, epoch) for topic, partition, offset, epoch in cur.fetchall()}


def _compare_and_set(cur, pipeline_name: str, topic: str, partition: int, expected: int, new: int,
                     batch_id: int | None) -> bool:
    cur.execute(
        "UPDATE kafka_batch.offsets SET next_offset = %s, updated_at = now(), batch_id = %s, leader_epoch = NULL"
        " WHERE pipeline = %s AND topic = %s AND partition = %s AND next_offset = %s",
        (new, batch_id, pipeline_name, topic, partition, expected),
    )
    return cur.rowcount == 1


def move_positions(cur, pipeline_name: str, batch_id: int, ranges: list[OffsetRange]) -> None:
    """The core move for every range of a batch in one statement: `from` -> `until` on each row only
    if its stored position is `from`; one range that does not match and nothing commits. The position
    keeps the range's leader epoch at `until` (planning checks the log against it later)."""
    keys = {(r.topic, r.partition) for r in ranges}
    if len(keys) != len(ranges):
        raise StateError(f"batch {batch_id}: two ranges of one partition; nothing was committed")
    cur.execute(
        "UPDATE kafka_batch.offsets o SET next_offset = r.until_offset, updated_at = now(), batch_id = %s,"
        " leader_epoch = r.until_epoch"
        " FROM (SELECT unnest(%s::text[]) AS topic, unnest(%s::int[]) AS partition,"
        " unnest(%s::bigint[]) AS from_offset, unnest(%s::bigint[]) AS until_offset,"
        " unnest(%s::int[]) AS until_epoch) r"
        " WHERE o.pipeline = %s AND o.topic = r.topic AND o.partition = r.partition AND o.next_offset = r.from_offset"
        " RETURNING o.topic, o.partition",
        (batch_id, [r.topic for r in ranges], [r.partition for r in ranges], [r.from_offset for r in ranges],
         [r.until_offset for r in ranges], [r.until_epoch for r in ranges], pipeline_name),
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
