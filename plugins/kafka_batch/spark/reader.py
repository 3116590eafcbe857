"""The createRDD idea on DataFrames: fixed offset ranges read by Spark tasks, records as Arrow.

The driver packs the (sub-)ranges into tasks (`core.ranges.pack_tasks`): a big range keeps its own
task, many small ones share one, read by one consumer assigned to all their partitions. One Spark
partition per task (`spark.range(n, numPartitions=n)`: partition i holds the number i, so no task
rows are shipped through Python); each executor task reads its ranges with
`kafka_source.read_partitions` and yields Arrow record batches, so a range is streamed, never held
in memory whole. Only the record columns the pipeline uses are built. Code here runs on executors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any

import pyarrow as pa

from kafka_batch import timings
from kafka_batch.config import ReadSettings
from kafka_batch.core.ranges import OffsetRange
from kafka_batch.kafka_source import read_partitions

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# Every column a record can have: (name, Arrow type, Spark type).
_COLUMNS = (
    ("range_id", pa.int64(), "long"), ("topic", pa.string(), "string"), ("partition", pa.int32(), "int"),
    ("offset", pa.int64(), "long"), ("timestamp", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("timestamp_type", pa.int32(), "int"), ("key", pa.binary(), "binary"), ("value", pa.binary(), "binary"),
    ("headers", _HEADER_TYPE, "array<struct<key:string,value:binary>>"),
)
ALL_COLUMNS = tuple(name for name, _, _ in _COLUMNS)
# What parsing, validation, error messages and the quarantine always need.
BASE_COLUMNS = ("range_id", "topic", "partition", "offset", "value")
RECORD_SCHEMA = ", ".join(f"`{name}` {spark}" for name, _, spark in _COLUMNS)


def record_schema(columns: Iterable[str] = ALL_COLUMNS) -> str:
    wanted = set(columns)
    return ", ".join(f"`{name}` {spark}" for name, _, spark in _COLUMNS if name in wanted)


def arrow_schema(columns: Iterable[str] = ALL_COLUMNS) -> pa.Schema:
    wanted = set(columns)
    return pa.schema([(name, arrow) for name, arrow, _ in _COLUMNS if name in wanted])


def columns_used(expressions: Iterable[str], optional: Iterable[str] = ("timestamp", "timestamp_type", "key")) -> tuple:
    """BASE_COLUMNS and the optional record columns named in any expression (a word match: a name in
    a string literal only costs building a column; a real use is never missed)."""
    words = set()
    for expression in expressions:
        words.update(w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expression))
    return tuple(c for c in ALL_COLUMNS if c in BASE_COLUMNS or (c in optional and c in words))


def messages_to_arrow(
    messages: list[Any], range_ids: dict[tuple[str, int], int] | int, columns: Iterable[str] = ALL_COLUMNS,
) -> pa.RecordBatch:
    """Columns of one consumed batch, in one pass; timestamps in microseconds UTC, null when the record
    has none. `range_ids` maps (topic, partition) to the range read there (or is the one range's id)."""
    schema = arrow_schema(columns)
    wanted = set(schema.names)
    topics, partitions, offsets, values = [], [], [], []
    timestamps, kinds, keys, headers = [], [], [], []
    want_time = "timestamp" in wanted or "timestamp_type" in wanted
    want_key, want_headers = "key" in wanted, "headers" in wanted
    for m in messages:
        topics.append(m.topic())
        partitions.append(m.partition())
        offsets.append(m.offset())
        values.append(m.value())
        if want_time:
            kind, ts = m.timestamp()
            kinds.append(kind)
            timestamps.append(ts * 1000 if kind else None)
        if want_key:
            keys.append(m.key())
        if want_headers:
            h = m.headers()
            headers.append([{"key": k, "value": v} for k, v in h] if h else None)
    if isinstance(range_ids, int):
        ids = [range_ids] * len(messages)
    else:
        ids = [range_ids[tp] for tp in zip(topics, partitions, strict=True)]
    data = {"range_id": ids, "topic": topics, "partition": partitions, "offset": offsets, "timestamp": timestamps,
            "timestamp_type": kinds, "key": keys, "value": values, "headers": headers}
    arrays = [pa.array(timestamps, pa.int64()).cast(field.type) if field.name == "timestamp"
              else pa.array(data[field.name], field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_task(kafka_config: dict[str, Any], ranges: list[OffsetRange], settings: dict[str, float],
              columns: Iterable[str] = ALL_COLUMNS) -> Iterator[pa.RecordBatch]:
    """The records of one task's ranges (one consumer for all of them) as Arrow batches."""
    columns = tuple(columns)
    range_ids = {(r.topic, r.partition): r.range_id for r in ranges}
    for messages in read_partitions(
        kafka_config, ranges, int(settings["consume_batch_size"]),
        settings["poll_timeout_seconds"], settings["stall_timeout_seconds"],
    ):
        yield messages_to_arrow(messages, range_ids, columns)


def _read_tasks(kafka_config: dict[str, Any], tasks: list[list[tuple]], settings: dict[str, float], columns: tuple):
    def read(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in numbers:
            for number in batch.column("id").to_pylist():
                timings.mark("task_start", task=number)
                ranges = [OffsetRange(t, p, lo, hi, range_id=rid) for rid, t, p, lo, hi in tasks[number]]
                yield from read_task(kafka_config, ranges, settings, columns)
                timings.mark("task_end", task=number)

    return read


def read_ranges(spark, kafka_config: dict[str, Any], tasks: list[list[OffsetRange]], settings: ReadSettings,
                columns: Iterable[str] = ALL_COLUMNS):
    """A DataFrame of the records of the given packed tasks (lists of (sub-)ranges), one Spark
    partition per task, with the given record columns."""
    if not tasks or not all(tasks):
        raise ValueError("read_ranges needs at least one task, and no empty one")
    columns = tuple(c for c in ALL_COLUMNS if c in set(columns))
    plain = [[(r.range_id, r.topic, r.partition, r.from_offset, r.until_offset) for r in task] for task in tasks]
    numbers = spark.range(0, len(plain), 1, len(plain))
    return numbers.mapInArrow(_read_tasks(kafka_config, plain, asdict(settings), columns), record_schema(columns))
