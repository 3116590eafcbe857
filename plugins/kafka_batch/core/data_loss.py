"""Data loss records, under on_data_loss: skip: offsets that retention deleted before a batch read them,
and offsets below a position whose records a truncated log (an unclean leader election) no longer holds.

A planned range notes the gap when it is found; the commit that moves past it writes it to the
`kafka_batch.data_loss` ledger in the same transaction.
"""

from __future__ import annotations

from kafka_batch.core.database import transaction


def record_data_loss(cur, pipeline_name: str, batch_id: int) -> None:
    """Inside the commit: every gap the batch moves past, into the data_loss ledger."""
    cur.execute(
        "INSERT INTO kafka_batch.data_loss (pipeline, topic, partition, lost_from, lost_until, detected_at, batch_id)"
        " SELECT %s, topic, partition, from_offset, lost_until, lost_detected_at, batch_id"
        " FROM kafka_batch.batch_ranges WHERE batch_id = %s AND lost_until IS NOT NULL AND replaces_range_id IS NULL"
        " UNION ALL SELECT %s, topic, partition, truncated_from, from_offset, lost_detected_at, batch_id"
        " FROM kafka_batch.batch_ranges WHERE batch_id = %s AND truncated_from IS NOT NULL AND replaces_range_id IS NULL",
        (pipeline_name, batch_id, pipeline_name, batch_id),
    )


def record_loss(conn, range_id: int, lost_until: int) -> None:
    """Under on_data_loss=skip: retention overtook a planned range before it was read."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batch_ranges SET lost_until = %s, lost_detected_at = now()"
            " WHERE id = %s AND (lost_until IS NULL OR lost_until < %s)",
            (lost_until, range_id, lost_until),
        )
