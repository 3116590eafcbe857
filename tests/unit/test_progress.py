"""The job's progress lines: from the two accumulators its read tasks add to under spark-submit, from
the server's task reports under Spark Connect (stand-ins here: the lines are pure formatting)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from kafka_batch.spark.job import _ConnectProgress, _Progress, _ReadProgress


def _lines(caplog, describe) -> list[str]:
    with caplog.at_level(logging.INFO, logger="kafka_batch.job"), _Progress(7, describe, interval=0.05):
        time.sleep(0.3)
    return [r.getMessage() for r in caplog.records if "progress" in r.getMessage()]


def test_progress_lines_say_ranges_read_records_and_rate(caplog):
    values = iter([120_000, 3])
    spark = SimpleNamespace(sparkContext=SimpleNamespace(accumulator=lambda _: SimpleNamespace(value=next(values))))
    lines = _lines(caplog, _ReadProgress(spark, 8))
    assert lines and all(line.startswith("batch 7 progress: 3 of 8 ranges read, 120000 records, ") for line in lines)
    assert lines[0].endswith(" records/s")


def test_progress_lines_under_spark_connect_count_tasks_done(caplog):
    handlers = []
    spark = SimpleNamespace(registerProgressHandler=handlers.append, removeProgressHandler=handlers.remove)
    progress = _ConnectProgress(spark)
    [report] = handlers
    report([SimpleNamespace(num_tasks=4, num_completed_tasks=1), SimpleNamespace(num_tasks=1, num_completed_tasks=0)],
           3, "op", False)
    lines = _lines(caplog, progress)
    assert lines and all(line.startswith("batch 7 progress: 1 of 5 Spark tasks done (") for line in lines)
    progress.close()
    assert not handlers
