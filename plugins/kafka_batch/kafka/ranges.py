"""Pure planning decisions: which offset ranges a batch reads, and how they are cut into Spark tasks.

No I/O here: the inputs are the stored positions and the offsets Kafka reported, the output is a
plan. That keeps every decision unit-testable and identical wherever it runs.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace

from kafka_batch.errors import DataLossError, InputError, StateError


@dataclass(frozen=True)
class OffsetRange:
    """[from_offset, until_offset) of one partition; until is exclusive."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    range_id: int | None = None
    # Under on_data_loss=skip: [from_offset, lost_until) was deleted before it was read.
    lost_until: int | None = None
    # The partition's leader epoch at `until_offset` when planned: stored with the position it commits, so
    # a later plan can ask the partition's leader whether its log still holds what was read.
    until_epoch: int | None = None
    # Under on_data_loss=skip: the log was truncated below from_offset (an unclean leader election), and
    # [truncated_from, from_offset) no longer holds the records committed there; recorded as lost.
    truncated_from: int | None = None

    @property
    def span(self) -> int:
        """Offsets covered; an upper bound on records (markers and compaction leave gaps)."""
        return self.until_offset - self.from_offset

    def readable(self) -> OffsetRange:
        """The part still in the log, which is what the reader reads."""
        if self.lost_until is None:
            return self
        return replace(self, from_offset=self.lost_until, lost_until=None)

    def __str__(self) -> str:
        lost = f" (lost {self.from_offset}..{self.lost_until})" if self.lost_until is not None else ""
        if self.truncated_from is not None:
            lost += f" (truncated {self.truncated_from}..{self.from_offset})"
        return f"{self.topic}[{self.partition}] {self.from_offset}..{self.until_offset}{lost}"


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: int
    position: int | None  # stored next offset, None for a partition never read
    log_start: int
    last_stable: int
    epoch: int | None = None  # the leader epoch at last_stable, now
    # Where the partition's log, as its leader has it now, stops holding what the pipeline committed below
    # its position (asked of the leader by the position's epoch: an unclean election truncated it); None
    # where nothing says so.
    truncated_at: int | None = None


def start_offset(state: PartitionState, start: str) -> int:
    """Where a partition without a stored position begins."""
    if start == "earliest":
        return state.log_start
    if start == "latest":
        return state.last_stable
    raise InputError(f"unknown start policy {start!r}")


def initial_positions(
    states: list[PartitionState],
    start: str,
    new_partitions: str = "earliest",
    start_offsets: dict[tuple[str, int], int] | None = None,
) -> dict[tuple[str, int], int]:
    """Positions for partitions that have none; stored when planning, before any range is read.

    `start` (earliest, latest, or `offsets`: the given `start_offsets`) applies while the pipeline
    has no position at all. Partitions or topics found later begin by `new_partitions`, by default
    at their log start, so the records written there since they were created are not lost.
    """
    new_pipeline = all(s.position is None for s in states)
    positions = {}
    for s in states:
        if s.position is not None:
            continue
        key = (s.topic, s.partition)
        if not new_pipeline:
            positions[key] = start_offset(s, new_partitions)
        elif start == "offsets":
            if key not in (start_offsets or {}):
                raise InputError(
                    f"{s.topic}[{s.partition}]: the start offsets give no offset for this partition; "
                    "give one for every partition of the pipeline's topics"
                )
            positions[key] = start_offsets[key]
        else:
            positions[key] = start_offset(s, start)
    return positions


def _truncated_from(state: PartitionState, on_data_loss: str) -> int | None:
    """Where the log stopped holding what the pipeline committed below its position (its end is below the
    position, or its leader says it diverged there), under `skip`; None if it holds it all. Under `fail`,
    a DataLossError: offsets the pipeline read now hold other records, or will."""
    ends_below = state.position > state.last_stable
    below = min(state.last_stable if ends_below else state.position,
                state.position if state.truncated_at is None else state.truncated_at)
    if below >= state.position:
        return None
    if on_data_loss == "skip":
        return below
    now = (f"its log ends at {state.last_stable}" if ends_below else
           f"its leader's log differs from offset {below} on")
    raise DataLossError(
        f"{state.topic}[{state.partition}]: data loss: {now}, below the stored position {state.position}: records"
        f" {below}..{state.position} that batches committed are no longer in it (an unclean leader election truncated"
        " it, or the topic was deleted and recreated), and new records take or will take those offsets"
        " (on_data_loss: fail; under skip the pipeline reads on from its position and records them as lost)"
    )


def _lost_until(state: PartitionState, on_data_loss: str) -> int | None:
    """Where readable data begins if retention overtook the position; None if nothing was lost."""
    where = f"{state.topic}[{state.partition}]"
    if state.position >= state.log_start:
        return None
    if on_data_loss == "skip":
        return state.log_start
    raise DataLossError(
        f"{where}: data loss: stored position {state.position} is below the earliest available offset "
        f"{state.log_start}; records {state.position}..{state.log_start} were deleted before they were read "
        "(on_data_loss: fail)"
    )


def recheck_retention(r: OffsetRange, log_start: int, on_data_loss: str) -> OffsetRange:
    """A planned range checked again just before it is read: retention may have overtaken it since."""
    readable_from = r.readable().from_offset
    if log_start <= readable_from:
        return r
    lost_until = min(log_start, r.until_offset)
    if on_data_loss == "skip":
        return replace(r, lost_until=lost_until)
    raise DataLossError(
        f"{r.topic}[{r.partition}]: data loss: range {r.from_offset}..{r.until_offset} (stored position "
        f"{r.from_offset}) needs offset {readable_from}, but the earliest available offset is now {log_start}; "
        f"records {readable_from}..{lost_until} were deleted before they were read (on_data_loss: fail)"
    )


def fair_shares(wanted: list[int], budget: int) -> list[int]:
    """Split a budget over partitions so small ones get all they want and big ones share the rest."""
    shares = [0] * len(wanted)
    remaining = budget
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    for n, i in enumerate(order):
        take = min(wanted[i], remaining // (len(order) - n))
        shares[i] = take
        remaining -= take
    return shares


def plan_ranges(
    states: list[PartitionState],
    max_records_per_partition: int,
    max_records_per_batch: int,
    on_data_loss: str = "fail",
) -> list[OffsetRange]:
    """The next ranges: from each stored position up to the last stable offset, within the limits.

    A position below the log start fails the plan, or under `skip` yields a range whose lost part
    [position, log start) is recorded when the batch commits; the limits count readable offsets. So does a
    log truncated below the position (`_truncated_from`): under `skip`, the range from the position notes
    the truncated part, once the log reaches the position again. Each range carries the leader epoch now,
    which its commit stores with the position.
    """
    candidates = []
    for state in sorted(states, key=lambda s: (s.topic, s.partition)):
        if state.position is None:
            raise StateError(f"{state.topic}[{state.partition}] has no stored position; store initial_positions first")
        truncated_from = _truncated_from(state, on_data_loss)
        if state.position > state.last_stable:
            continue  # truncated below the position, under skip: nothing to read until the log is back there
        lost_until = _lost_until(state, on_data_loss)
        begin = state.position if lost_until is None else lost_until
        end = min(state.last_stable, begin + max_records_per_partition)
        candidates.append((state, lost_until, truncated_from, begin, end))
    shares = fair_shares([end - begin for *_, begin, end in candidates], max_records_per_batch)
    ranges = []
    for (state, lost_until, truncated_from, begin, _end), share in zip(candidates, shares, strict=True):
        if share > 0 or lost_until is not None:
            ranges.append(OffsetRange(state.topic, state.partition, state.position, begin + share, None, lost_until,
                                      state.epoch, truncated_from))
    return ranges


def split_for_tasks(ranges: list[OffsetRange], max_records_per_task: int, min_tasks: int = 1) -> list[OffsetRange]:
    """Cut ranges into contiguous sub-ranges, one Spark task each; sub-ranges keep their range_id.

    Boundaries are offsets, so a cut may fall on a marker or a compacted gap: each sub-range is
    still read until its position reaches its own `until`, and together they cover the range exactly.
    """
    if max_records_per_task < 1 or min_tasks < 1:
        raise ValueError("max_records_per_task and min_tasks must be >= 1")
    pieces = {id(r): -(-r.span // max_records_per_task) for r in ranges}
    while sum(pieces.values()) < min_tasks:
        splittable = [r for r in ranges if pieces[id(r)] < r.span]
        if not splittable:
            break
        widest = max(splittable, key=lambda r: r.span / pieces[id(r)])
        pieces[id(widest)] += 1
    tasks = []
    for r in ranges:
        n = pieces[id(r)]
        bounds = [r.from_offset + (r.span * i) // n for i in range(n + 1)]
        tasks.extend(
            replace(r, from_offset=lo, until_offset=hi) for lo, hi in itertools.pairwise(bounds) if hi > lo
        )
    return tasks


def pack_tasks(pieces: list[OffsetRange], max_records_per_task: int, slots: int = 1) -> list[list[OffsetRange]]:
    """Group the pieces of `split_for_tasks` into Spark tasks, each read by one consumer.

    A task holds at most one piece per partition and at most `max_records_per_task` offsets (a
    bigger piece stays alone, its cuts unchanged). There are at least `slots` tasks (the cores that
    would otherwise idle) when there are that many pieces; each piece goes, biggest first, to the
    least loaded task it fits, so many small ranges cost a few tasks instead of one each. The pieces of
    a range then rise with the task index (`_in_task_order`), so a result streamed in task order comes
    in offset order within each range.
    """
    if max_records_per_task < 1 or slots < 1:
        raise ValueError("max_records_per_task and slots must be >= 1")
    total = sum(p.span for p in pieces)
    count = min(len(pieces), max(slots, -(-total // max_records_per_task)))
    tasks: list[list[OffsetRange]] = [[] for _ in range(count)]
    partitions: list[set[tuple[str, int]]] = [set() for _ in range(count)]
    heap = [(0, i) for i in range(count)]  # (load, task), least loaded first
    for piece in sorted(pieces, key=lambda p: (-p.span, p.topic, p.partition, p.from_offset)):
        where = (piece.topic, piece.partition)
        skipped, chosen = [], None
        while heap:
            load, i = heapq.heappop(heap)
            if load and load + piece.span > max_records_per_task:
                skipped.append((load, i))  # the least loaded task is full: so is every other
                break
            if where in partitions[i]:
                skipped.append((load, i))  # a consumer reads a partition from one offset only
                continue
            chosen = (load, i)
            break
        if chosen is None:
            tasks.append([])
            partitions.append(set())
            chosen = (0, len(tasks) - 1)
        load, i = chosen
        tasks[i].append(piece)
        partitions[i].add(where)
        for item in [*skipped, (load + piece.span, i)]:
            heapq.heappush(heap, item)
    return _in_task_order([sorted(t, key=lambda p: (p.topic, p.partition, p.from_offset)) for t in tasks if t])


def _in_task_order(tasks: list[list[OffsetRange]]) -> list[list[OffsetRange]]:
    """Re-cut each range's pieces so their offsets rise with the task index, every piece keeping its
    span (so each task its load): the tasks that hold pieces of a range, in order, take its offsets in
    order."""
    held: dict[tuple, list[tuple[int, int]]] = {}  # a range -> (task, position in it) of each of its pieces
    for i, task in enumerate(tasks):
        for j, piece in enumerate(task):
            held.setdefault((piece.topic, piece.partition, piece.range_id), []).append((i, j))
    for places in held.values():
        pieces = [tasks[i][j] for i, j in places]
        start = min(p.from_offset for p in pieces)
        if len(pieces) == 1 or max(p.until_offset for p in pieces) - start != sum(p.span for p in pieces):
            continue  # one piece, or not one contiguous range (ranges without ids): nothing to re-cut
        for i, j in places:  # enumerated in task order
            span = tasks[i][j].span
            tasks[i][j] = replace(tasks[i][j], from_offset=start, until_offset=start + span)
            start += span
    return tasks
