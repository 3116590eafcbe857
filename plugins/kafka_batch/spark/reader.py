"""The createRDD idea on DataFrames: one Spark partition per fixed offset range, records as Arrow.

The driver builds a one-row-per-task DataFrame in as many partitions as there are tasks; each
executor task reads its sub-range with `kafka_source.read_range` and yields Arrow record batches,
so a range is streamed, never held in memory whole. Code here runs on executors: no Airflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pyarrow as pa

from kafka_batch.config import ReadSettings
from kafka_batch.core.ranges import OffsetRange
from kafka_batch.kafka_source import read_range

TASK_SCHEMA = "range_id long, topic string, partition int, from_offset long, until_offset long"
RECORD_SCHEMA = (
    "range_id long, topic string, partition int, offset long, timestamp timestamp, timestamp_type int,"
    " key binary, value binary, headers array<struct<key:string,value:binary>>"
)
_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_ARROW_SCHEMA = pa.schema([
    ("range_id", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestamp_type", pa.int32()), ("key", pa.binary()),
    ("value", pa.binary()), ("headers", _HEADER_TYPE),
])


def messages_to_arrow(messages: list[Any], range_id: int) -> pa.RecordBatch:
    """Columns of one consumed batch; timestamps in microseconds UTC, null when the record has none."""
    n = len(messages)
    timestamps = [m.timestamp() for m in messages]
    headers = [m.headers() for m in messages]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([range_id] * n, pa.int64()),
            pa.array([m.topic() for m in messages], pa.string()),
            pa.array([m.partition() for m in messages], pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([ts * 1000 if kind else None for kind, ts in timestamps], pa.int64()).cast(_ARROW_SCHEMA.field("timestamp").type),
            pa.array([kind for kind, _ in timestamps], pa.int32()),
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers], _HEADER_TYPE),
        ],
        schema=_ARROW_SCHEMA,
    )


def _read_tasks(kafka_config: dict[str, Any], settings: dict[str, float]):
    def read(task_batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for task_batch in task_batches:
            for task in task_batch.to_pylist():
                offset_range = OffsetRange(
                    task["topic"], task["partition"], task["from_offset"], task["until_offset"], range_id=task["range_id"]
                )
                for messages in read_range(
                    kafka_config, offset_range, int(settings["consume_batch_size"]),
                    settings["poll_timeout_seconds"], settings["stall_timeout_seconds"],
                ):
                    yield messages_to_arrow(messages, task["range_id"])

    return read


def read_ranges(spark, kafka_config: dict[str, Any], tasks: list[OffsetRange], settings: ReadSettings):
    """A DataFrame of the records of the given (sub-)ranges, one Spark partition per task."""
    if not tasks:
        raise ValueError("read_ranges needs at least one task")
    rows = [(t.range_id, t.topic, t.partition, t.from_offset, t.until_offset) for t in tasks]
    task_df = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), TASK_SCHEMA)
    return task_df.mapInArrow(_read_tasks(kafka_config, asdict(settings)), RECORD_SCHEMA)
