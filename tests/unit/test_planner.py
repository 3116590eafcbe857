"""Planner decisions, as pure functions."""

from __future__ import annotations

import pytest

from kafka_batch.errors import DataLossError, InputError, StateError
from kafka_batch.kafka import ranges as ranges_module
from kafka_batch.kafka.ranges import (
    OffsetRange,
    PartitionState,
    fair_shares,
    initial_positions,
    pack_tasks,
    plan_ranges,
    recheck_retention,
    split_for_tasks,
)


def state(partition, position, log_start=0, last_stable=100, topic="t", **more):
    return PartitionState(topic, partition, position, log_start, last_stable, **more)


def test_ranges_run_from_position_to_last_stable_offset():
    ranges = plan_ranges([state(0, 10), state(1, 100), state(2, 40, last_stable=55)], 1000, 10_000)
    assert ranges == [OffsetRange("t", 0, 10, 100), OffsetRange("t", 2, 40, 55)]


def test_unseen_partition_starts_by_policy():
    assert initial_positions([state(0, None, log_start=7), state(1, None, log_start=7)], "earliest") == {
        ("t", 0): 7, ("t", 1): 7,
    }
    assert initial_positions([state(0, None, log_start=7)], "latest") == {("t", 0): 100}


def test_ranges_need_a_position():
    with pytest.raises(StateError, match=r"t\[0\] has no stored position"):
        plan_ranges([state(0, None)], 1000, 1000)


def test_per_partition_cap():
    assert plan_ranges([state(0, 0)], 30, 1000) == [OffsetRange("t", 0, 0, 30)]


def test_batch_cap_is_shared_fairly():
    ranges = plan_ranges([state(0, 0, last_stable=10), state(1, 0), state(2, 0)], 1000, 70)
    assert [r.span for r in ranges] == [10, 30, 30]


def test_fair_shares_never_exceed_budget_or_wants():
    assert fair_shares([5, 50, 500], 100) == [5, 47, 48]
    assert fair_shares([1, 2], 100) == [1, 2]
    assert sum(fair_shares([9, 9, 9], 10)) <= 10


def test_position_below_log_start_is_data_loss():
    with pytest.raises(DataLossError, match=r"t\[0\]: data loss: stored position 5 is below the earliest available offset 20"):
        plan_ranges([state(0, 5, log_start=20)], 1000, 1000)


def test_a_log_truncated_below_the_position_is_data_loss():
    # Its end below the position (a lagging replica elected, or the topic recreated) ...
    with pytest.raises(DataLossError, match=r"t\[1\]: data loss: its log ends at 100, below the stored position 150:"
                       r" records 100..150 that batches committed are no longer in it"):
        plan_ranges([state(1, 150)], 1000, 1000)
    # ... or its leader's log diverging below it, new records written over it since.
    with pytest.raises(DataLossError, match=r"t\[1\]: data loss: its leader's log differs from offset 40 on, below the"
                       r" stored position 60: records 40..60"):
        plan_ranges([state(1, 60, truncated_at=40)], 1000, 1000)
    assert plan_ranges([state(1, 60, truncated_at=60, epoch=7)], 1000, 1000) == [
        OffsetRange("t", 1, 60, 100, until_epoch=7)]  # intact up to the position: nothing lost


def test_skip_reads_on_from_the_position_and_records_the_truncated_offsets_as_lost():
    assert plan_ranges([state(1, 60, truncated_at=40, epoch=3)], 1000, 1000, "skip") == [
        OffsetRange("t", 1, 60, 100, until_epoch=3, truncated_from=40)]
    # The log's end still below the position: nothing to read there yet.
    assert plan_ranges([state(0, 150), state(1, 20)], 1000, 1000, "skip") == [OffsetRange("t", 1, 20, 100)]


def test_split_covers_each_range_contiguously_and_keeps_range_id():
    r = OffsetRange("t", 0, 10, 35, range_id=4)
    tasks = split_for_tasks([r], max_records_per_task=10)
    assert [(t.from_offset, t.until_offset) for t in tasks] == [(10, 18), (18, 26), (26, 35)]
    assert {t.range_id for t in tasks} == {4}


def test_split_reaches_min_tasks_by_cutting_the_widest_range():
    tasks = split_for_tasks([OffsetRange("t", 0, 0, 100, range_id=1), OffsetRange("t", 1, 0, 10, range_id=2)], 1000, 4)
    assert len(tasks) == 4
    assert [t.span for t in tasks if t.range_id == 1] == [33, 33, 34]
    assert sum(t.span for t in tasks) == 110


def test_split_never_makes_empty_tasks():
    tasks = split_for_tasks([OffsetRange("t", 0, 0, 2, range_id=1)], 1000, 8)
    assert [(t.from_offset, t.until_offset) for t in tasks] == [(0, 1), (1, 2)]


def test_partitions_found_later_start_by_new_partitions_not_by_start():
    states = [state(0, 100), state(1, None, log_start=3, last_stable=12), state(0, None, log_start=2, topic="u")]
    assert initial_positions(states, "latest") == {("t", 1): 3, ("u", 0): 2}
    assert initial_positions(states, "earliest", new_partitions="latest") == {("t", 1): 12, ("u", 0): 100}


def test_explicit_start_offsets_cover_every_partition():
    states = [state(0, None), state(1, None)]
    assert initial_positions(states, "offsets", start_offsets={("t", 0): 5, ("t", 1): 9}) == {("t", 0): 5, ("t", 1): 9}
    with pytest.raises(InputError, match=r"t\[1\]: the start offsets give no offset for this partition"):
        initial_positions(states, "offsets", start_offsets={("t", 0): 5})


def test_skip_plans_past_the_lost_records_and_says_which_were_lost():
    ranges = plan_ranges([state(0, 5, log_start=20), state(1, 30, log_start=20)], 50, 1000, on_data_loss="skip")
    assert ranges == [OffsetRange("t", 0, 5, 70, lost_until=20), OffsetRange("t", 1, 30, 80)]
    assert ranges[0].readable() == OffsetRange("t", 0, 20, 70)
    # Everything left was lost: the range still moves the position past the gap.
    assert plan_ranges([state(0, 5, log_start=100)], 50, 1000, "skip") == [OffsetRange("t", 0, 5, 100, lost_until=100)]


def test_retention_is_checked_again_before_reading():
    planned = OffsetRange("t", 0, 10, 50, range_id=1)
    assert recheck_retention(planned, 10, "fail") is planned
    with pytest.raises(DataLossError, match=r"t\[0\]: data loss: .*stored position 10.*earliest available offset is now 30"):
        recheck_retention(planned, 30, "fail")
    assert recheck_retention(planned, 30, "skip").lost_until == 30
    assert recheck_retention(planned, 90, "skip").lost_until == 50


def _check_packing(pieces, tasks, max_records_per_task):
    flat = [p for t in tasks for p in t]
    assert sorted(p.span for p in flat) == sorted(p.span for p in pieces)  # the pieces' cuts kept
    for range_id in {p.range_id for p in pieces}:
        read = [(p.from_offset, p.until_offset) for p in flat if p.range_id == range_id]  # in task order
        ends = sorted((p.from_offset, p.until_offset) for p in pieces if p.range_id == range_id)
        assert read == sorted(read), "a range's pieces rise with the task index"
        assert [lo for lo, _ in read[1:]] == [hi for _, hi in read[:-1]]  # contiguous
        assert (read[0][0], read[-1][1]) == (ends[0][0], ends[-1][1])  # over the range's offsets
    for t in tasks:
        assert len({(p.topic, p.partition) for p in t}) == len(t)  # one consumer reads a partition once
        assert len(t) == 1 or sum(p.span for p in t) <= max_records_per_task


def test_many_small_ranges_share_a_few_tasks():
    pieces = [OffsetRange("t", p, 0, 100, range_id=p) for p in range(1000)]
    tasks = pack_tasks(pieces, max_records_per_task=1_000_000, slots=2)
    assert len(tasks) == 2 and {len(t) for t in tasks} == {500}
    _check_packing(pieces, tasks, 1_000_000)
    tasks = pack_tasks(pieces, max_records_per_task=30_000, slots=2)  # the limit still bounds a task
    assert len(tasks) == 4
    _check_packing(pieces, tasks, 30_000)


def test_big_ranges_keep_their_cuts_and_pieces_of_one_partition_never_share_a_consumer():
    ranges = [OffsetRange("t", 0, 0, 2_500_000, range_id=1), OffsetRange("t", 1, 0, 10, range_id=2),
              OffsetRange("u", 1, 5, 9, range_id=3)]
    pieces = split_for_tasks(ranges, 1_000_000, min_tasks=1)
    tasks = pack_tasks(pieces, 1_000_000, slots=2)
    _check_packing(pieces, tasks, 1_000_000)
    assert sorted(p.span for t in tasks for p in t if p.range_id == 1) == [833_333, 833_333, 833_334]
    assert len(tasks) == 3  # the small ranges join the big pieces' tasks only within the limit
    tasks = pack_tasks(split_for_tasks([OffsetRange("t", 0, 0, 40, range_id=1)], 10), 100, slots=1)
    assert len(tasks) == 4  # pieces of one partition: a consumer cannot hold two, whatever the room


def test_a_ranges_pieces_rise_with_the_task_index_whatever_the_packing(monkeypatch):
    # Packed biggest first, some range's pieces land in falling task order; re-cut, task order is offset
    # order within every range, and every task keeps its load.
    ranges = [OffsetRange("t", p, 0, span, range_id=p) for p, span in enumerate((20, 13, 30, 5, 9))]
    pieces = split_for_tasks(ranges, 7, min_tasks=1)
    tasks = pack_tasks(pieces, 14, slots=3)
    _check_packing(pieces, tasks, 14)
    monkeypatch.setattr(ranges_module, "_in_task_order", lambda tasks: tasks)
    as_packed = pack_tasks(pieces, 14, slots=3)
    assert [sum(p.span for p in t) for t in tasks] == [sum(p.span for p in t) for t in as_packed]
    with pytest.raises(AssertionError, match="rise with the task index"):
        _check_packing(pieces, as_packed, 14)  # the packing alone does not keep the order


def test_fewer_pieces_than_slots_give_one_task_each():
    pieces = [OffsetRange("t", p, 0, 10, range_id=p) for p in range(3)]
    assert pack_tasks(pieces, 100, slots=8) == [[p] for p in pieces]
    assert pack_tasks([], 100, slots=2) == []
