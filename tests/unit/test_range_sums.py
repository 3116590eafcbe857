"""Counts summed per range (sinks.base.sums_by_range): pure logic, against sums written out by hand."""

from __future__ import annotations

import gc
import random

import pyarrow as pa

from kafka_batch.sinks.base import RangeCounts, range_counts, sums_by_range
from kafka_batch.spark import collector


def test_sums_per_range_match_sums_added_up_row_by_row():
    rng = random.Random(5)
    rows = [(rng.choice([9, 2, 2**40, 7]), rng.choice([None, 0, 1, 3]), rng.random() < 0.5) for _ in range(5000)]
    table = pa.table({
        "range_id": pa.chunked_array([[r[0] for r in rows[:1200]], [r[0] for r in rows[1200:]]], pa.int64()),
        "records": pa.array([r[1] for r in rows], pa.int64()),
        "flagged": pa.array([r[2] for r in rows]),  # booleans count as one
    })
    expected: dict[int, list[int]] = {}
    for range_id, records, flagged in rows:
        totals = expected.setdefault(range_id, [0, 0])
        totals[0] += records or 0
        totals[1] += flagged
    summed = sums_by_range(table, ("records", "flagged"))
    assert summed.column_names == ["range_id", "records", "flagged"]
    assert summed.to_pylist() == [{"range_id": k, "records": v[0], "flagged": v[1]} for k, v in sorted(expected.items())]


def test_range_counts_of_no_rows_and_of_a_few():
    empty = pa.table({c: pa.array([], pa.int64()) for c in ("range_id", "records", "tombstones", "invalid")})
    assert range_counts(empty) == {}
    few = pa.table({"range_id": [3, 1, 3], "records": [1, None, 2], "tombstones": [0, 1, 0], "invalid": [0, 0, 1]})
    assert range_counts(few) == {1: RangeCounts(0, 1, 0), 3: RangeCounts(3, 0, 1)}


def test_the_collector_is_paused_for_the_block_only_and_stays_off_if_it_was():
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_batch_driver_imports_no_query_engine_to_count():
    """pyarrow's group_by needs its query engine (acero, with pyarrow.dataset): 0.3 s of every batch's
    driver, for sums a few numpy calls give."""
    import subprocess
    import sys

    probe = ("import sys, pyarrow as pa, kafka_batch.spark.job, kafka_batch.core.commit;"
             "from kafka_batch.sinks import staging; from kafka_batch.sinks.base import range_counts;"
             "range_counts(pa.table({c: [1] for c in ('range_id', 'records', 'tombstones', 'invalid')}));"
             "staging.per_range(pa.array([1]), pa.array([True]), pa.array([False]), pa.array([False]));"
             "print(sorted(m for m in sys.modules if m.startswith(('pyarrow.acero', 'pyarrow.dataset'))))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip().splitlines()[-1] == "[]"
