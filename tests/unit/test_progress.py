"""The job's progress lines, from the two accumulators its read tasks add to (stand-ins here: the
lines are pure formatting of what the accumulators hold)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from kafka_batch.spark.job import _Progress


def test_progress_lines_say_ranges_read_records_and_rate(caplog):
    records, ranges = SimpleNamespace(value=120_000), SimpleNamespace(value=3)
    with caplog.at_level(logging.INFO, logger="kafka_batch.job"), _Progress(7, (records, ranges), 8, interval=0.05):
        time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records if "progress" in r.getMessage()]
    assert lines and all(line.startswith("batch 7 progress: 3 of 8 ranges read, 120000 records, ") for line in lines)
    assert lines[0].endswith(" records/s")
