"""Attempts: each execution of a batch takes a new token, and only the current token may commit.

Claiming an attempt fences every older one still running (a zombie task, a racing retry): at commit
time `lock_current_attempt` refuses a token that is no longer the batch's.
"""

from __future__ import annotations

from kafka_batch.core.batches import Batch, load_batch, select_batch, set_status
from kafka_batch.core.database import transaction
from kafka_batch.core.registry import lock_pipeline
from kafka_batch.core.state import RUNNABLE, BatchStatus
from kafka_batch.errors import FencedAttempt, StateError


def claim_attempt(conn, batch_id: int, try_number: int | None = None) -> int:
    """Start a new attempt of a runnable batch: any older attempt still running can no longer commit."""
    with transaction(conn) as cur:
        cur.execute(
            "UPDATE kafka_batch.batches SET attempt = attempt + 1, started_at = now(),"
            " try_number = coalesce(%s, try_number) WHERE id = %s AND status = ANY(%s) RETURNING attempt",
            (try_number, batch_id, list(RUNNABLE)),
        )
        row = cur.fetchone()
    if row is None:
        batch = load_batch(conn, batch_id)
        raise StateError(f"batch {batch_id} is {batch.status}; it can no longer be executed")
    return row[0]


def current_attempt(conn, batch_id: int) -> tuple[int, str] | None:
    """The batch's attempt token and status (a fence watch stops when either changes)."""
    with transaction(conn) as cur:
        cur.execute("SELECT attempt, status FROM kafka_batch.batches WHERE id = %s", (batch_id,))
        row = cur.fetchone()
    return None if row is None else (row[0], row[1])


def mark_failed(conn, batch_id: int, attempt: int, error: str) -> None:
    """Record why the current attempt failed; a committed or newer attempt is left alone."""
    with transaction(conn) as cur:
        set_status(cur, batch_id, BatchStatus.FAILED, attempt=attempt, error=error)


def lock_current_attempt(cur, pipeline_name: str, batch_id: int, attempt: int) -> Batch:
    """Lock the pipeline and the batch; refuse an attempt that is no longer the batch's current one.

    A committed batch is returned as it is (committing it again is a no-op).
    """
    lock_pipeline(cur, pipeline_name)
    batch = select_batch(cur, batch_id, lock=True)
    if batch is None or batch.pipeline != pipeline_name:
        raise StateError(f"batch {batch_id} does not exist for pipeline {pipeline_name!r}")
    if batch.status == BatchStatus.COMMITTED:
        return batch
    if not batch.runnable:
        raise FencedAttempt(f"batch {batch_id} is {batch.status} ({batch.error}); it can no longer commit")
    if batch.attempt != attempt:
        raise FencedAttempt(
            f"batch {batch_id}: attempt {attempt} is stale, attempt {batch.attempt} started since; not committing"
        )
    return batch
