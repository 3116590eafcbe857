"""A batch's status and the moves allowed between them: the one place that says what may happen next.

Postgres updates use `sources(new)` in their WHERE clause, so a move the table below does not allow
changes no row, whatever code asks for it.
"""

from __future__ import annotations

from enum import StrEnum

from kafka_batch.errors import StateError


class BatchStatus(StrEnum):
    PLANNED = "planned"        # ranges persisted; an attempt may run
    EMPTY = "empty"            # nothing to read; done
    FAILED = "failed"          # the last attempt failed; the next attempt (a retry) may run
    COMMITTED = "committed"    # results and positions moved in one transaction; final
    SUPERSEDED = "superseded"  # planned from positions that moved since; can never commit
    PREVIEWED = "previewed"    # a replay's dry run stored its preview; can never commit

    @property
    def runnable(self) -> bool:
        """An attempt may execute (and commit) the batch."""
        return BatchStatus.COMMITTED in ALLOWED[self]


_FROM_RUNNABLE = frozenset({BatchStatus.FAILED, BatchStatus.COMMITTED, BatchStatus.SUPERSEDED, BatchStatus.PREVIEWED})
ALLOWED: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.PLANNED: _FROM_RUNNABLE,
    BatchStatus.FAILED: _FROM_RUNNABLE,
    BatchStatus.EMPTY: frozenset(),
    BatchStatus.COMMITTED: frozenset(),
    BatchStatus.SUPERSEDED: frozenset(),
    BatchStatus.PREVIEWED: frozenset(),
}
RUNNABLE = tuple(s.value for s in BatchStatus if s.runnable)


def sources(new: BatchStatus) -> list[str]:
    """The statuses a batch may move to `new` from (for a WHERE status = ANY(...))."""
    return [old.value for old, targets in ALLOWED.items() if new in targets]


def check(batch_id: int, old: str, new: BatchStatus) -> None:
    """Refuse a move the table does not allow, naming the batch and both statuses."""
    if new not in ALLOWED[BatchStatus(old)]:
        raise StateError(f"batch {batch_id} is {old}; it cannot become {new.value}")
