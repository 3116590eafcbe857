"""The createRDD idea on DataFrames: fixed offset ranges read by Spark tasks, records as Arrow.

The driver packs the (sub-)ranges into tasks (`ranges.pack_tasks`): a big range keeps its own
task, many small ones share one, read by one consumer assigned to all their partitions. One Spark
partition per task (`spark.range(n, numPartitions=n)`: partition i holds the number i, so no task
rows are shipped through Python); each executor task reads its ranges with
`kafka_source.read_partitions` and yields Arrow record batches, so a range is streamed, never held
in memory whole. Only the record columns the pipeline uses are built, and the values are decoded
here by the pipeline's decoder: `json_fields.JsonFields` parses a JSON pipeline's fields when pyarrow
can, `formats.columns.Decoded` decodes Avro and Protobuf. A decoder gives `columns()` (name, Arrow type, Spark type)
and `decode(values, keys)`, those columns for a chunk of records. Code here runs on executors.
"""

from __future__ import annotations

import gc
import operator
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.kafka.source import read_partitions
from kafka_batch.observability import timings
from kafka_batch.spark import collector

if TYPE_CHECKING:  # the definition's model: a cold Python worker would pay 0.3 s importing it
    from kafka_batch.config import ReadSettings


class Decoder(Protocol):
    """How the values become columns (see the module's docstring)."""

    def columns(self) -> list[tuple[str, pa.DataType, str]]: ...

    def decode(self, values: list[bytes | None], keys: list[bytes | None]) -> list[pa.Array]: ...

    def replaces_values(self, decoded: list[pa.Array]) -> bool:
        """Whether these decoded columns hold all that is read of the chunk's values (see `VALUES`)."""
        ...


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
# A read's values: "all", or "unparsed": a value its decoder replaced by columns (a JSON chunk parsed in the
# reader) is left out, null, and VALUE_BYTES gives every value's length (null for a tombstone). Spark copies
# each row's bytes as it takes it from Arrow (a third of its work in a read task), the values most of them,
# and nothing after the parse reads those values (the quarantine reads its records again, whole).
VALUES = ("all", "unparsed")
VALUE_BYTES = "_value_bytes"
_first, _second = operator.itemgetter(0), operator.itemgetter(1)


def _columns(columns: Iterable[str], decoder: Decoder | None, values: str = "all") -> list[tuple[str, pa.DataType, str]]:
    if values not in VALUES:
        raise ValueError(f"values must be one of {VALUES}, got {values!r}")
    wanted = set(columns)
    lengths = [(VALUE_BYTES, pa.int32(), "int")] if values == "unparsed" else []
    return [c for c in _COLUMNS if c[0] in wanted] + lengths + (decoder.columns() if decoder is not None else [])


def record_schema(columns: Iterable[str] = ALL_COLUMNS, decoder: Decoder | None = None, values: str = "all") -> str:
    """The Spark schema of the records read with these columns (and the decoder's)."""
    return ", ".join(f"`{name}` {spark}" for name, _, spark in _columns(columns, decoder, values))


def arrow_schema(columns: Iterable[str] = ALL_COLUMNS, decoder: Decoder | None = None, values: str = "all") -> pa.Schema:
    return pa.schema([(name, arrow) for name, arrow, _ in _columns(columns, decoder, values)])


def expression_words(expressions: Iterable[str]) -> set[str]:
    """The names an expression may use, lower-cased (a word match: a name in a string literal only costs
    building a column; a real use is never missed)."""
    words = set()
    for expression in expressions:
        words.update(w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expression))
    return words


def columns_used(expressions: Iterable[str], optional: Iterable[str] = ("timestamp", "timestamp_type", "key")) -> tuple:
    """BASE_COLUMNS and the optional record columns named in any expression."""
    words = expression_words(expressions)
    return tuple(c for c in ALL_COLUMNS if c in BASE_COLUMNS or (c in optional and c in words))


def messages_to_arrow(messages: list[Any], r: OffsetRange, columns: Iterable[str] = ALL_COLUMNS,
                      decoder: Decoder | None = None, values: str = "all") -> pa.RecordBatch:
    """Columns of consumed records of one range's partition (`chunks_to_arrow` of one chunk)."""
    return chunks_to_arrow([(r, messages)], columns, decoder, values)


def chunks_to_arrow(chunks: list[tuple[OffsetRange, list[Any]]], columns: Iterable[str] = ALL_COLUMNS,
                    decoder: Decoder | None = None, values: str = "all") -> pa.RecordBatch:
    """Columns of consumed records, given as chunks of one range's partition each; timestamps in
    microseconds UTC, null when the record has none. Each column is one pass in C (map over the Message
    methods) over all the chunks: a task over many partitions gets chunks of a few records each, and a
    pass (the JSON parse most) costs a fixed amount besides its records. A chunk's range id, topic and
    partition are constants, never read per record. The decoder's columns follow; `values`: see VALUES."""
    schema = arrow_schema(columns, decoder, values)
    messages = chunks[0][1] if len(chunks) == 1 else [m for _, chunk in chunks for m in chunk]
    n = len(messages)
    arrays = []
    payloads = list(map(Message.value, messages))
    decoded = decoder.decode(payloads, list(map(Message.key, messages))) if decoder is not None else []
    whole = None  # the value column, when built: its lengths come from its offsets
    for field in schema:
        name = field.name
        if name == VALUE_BYTES:
            arrays.append(_lengths(payloads) if whole is None else pc.binary_length(whole))
            continue
        if name not in ALL_COLUMNS:
            arrays.extend(decoded)
            break
        if name in ("range_id", "topic", "partition"):
            arrays.append(_per_chunk([getattr(r, name) for r, _ in chunks], [len(c) for _, c in chunks], field.type))
        elif name == "timestamp_type":
            arrays.append(pa.array(map(_first, map(Message.timestamp, messages)), pa.int32(), size=n))
        elif name == "timestamp":
            millis = pa.array(np.fromiter(map(_second, map(Message.timestamp, messages)), np.int64, n))
            # A record without a timestamp has -1 (0 in old formats): only then are the kinds needed.
            if n and pc.min(millis).as_py() <= 0:
                kinds = pa.array(map(_first, map(Message.timestamp, messages)), pa.int32(), size=n)
                unknown = pc.equal(kinds, TIMESTAMP_NOT_AVAILABLE)
                millis = pc.if_else(unknown, pa.scalar(None, pa.int64()), millis)
            arrays.append(pc.multiply(millis, 1000).cast(field.type))
        elif name == "headers":
            arrays.append(pa.array([[{"key": k, "value": v} for k, v in h] if h else None
                                    for h in map(Message.headers, messages)], field.type))
        elif name == "value":
            if values == "unparsed" and decoder is not None and decoder.replaces_values(decoded):
                arrays.append(pa.nulls(n, pa.binary()))
            else:
                whole = _binary(payloads)
                arrays.append(whole)
        elif name == "offset":
            arrays.append(_offsets(chunks, messages))
        else:  # the key, the one column left
            arrays.append(pa.array(list(map(Message.key, messages)), field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _per_chunk(constants: list, counts: list[int], type_: pa.DataType) -> pa.Array:
    """A column holding each chunk's constant once per record of the chunk."""
    if len(constants) == 1:
        return pa.repeat(pa.scalar(constants[0], type_), counts[0])
    return pa.array(constants, type_).take(np.repeat(np.arange(len(constants)), counts))


def _offsets(chunks: list[tuple[OffsetRange, list[Any]]], messages: list[Any]) -> pa.Array:
    """The records' offsets. A chunk's are increasing: when its last is its first plus its length less
    one, they are every offset in between (no markers, no compaction), made without asking each record."""
    if chunks and all(c and c[-1].offset() - c[0].offset() == len(c) - 1 for _, c in chunks):
        spans = [np.arange(c[0].offset(), c[0].offset() + len(c), dtype=np.int64) for _, c in chunks]
        return pa.array(spans[0] if len(spans) == 1 else np.concatenate(spans))
    return pa.array(np.fromiter(map(Message.offset, messages), np.int64, len(messages)))


def _binary(values: list[bytes | None]) -> pa.Array:
    """A binary array from its buffers: four times as fast as from the list (tombstones: the list)."""
    n = len(values)
    data = b"".join(values) if None not in values else None
    if data is None or len(data) >= 2**31:
        return pa.array(values, pa.binary())
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.fromiter(map(len, values), np.int32, n), out=offsets[1:])
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _lengths(values: list[bytes | None]) -> pa.Array:
    if None not in values:
        return pa.array(np.fromiter(map(len, values), np.int32, len(values)))
    return pa.array([None if v is None else len(v) for v in values], pa.int32())


def read_task(kafka_config: dict[str, Any], ranges: list[OffsetRange], settings: dict[str, float],
              columns: Iterable[str] = ALL_COLUMNS, decoder: Decoder | None = None,
              values: str = "all") -> Iterator[pa.RecordBatch]:
    """The records of one task's ranges (one consumer for all of them) as Arrow batches of about
    `consume_batch_size` records: the small chunks of many partitions make one batch together, since
    every batch costs its columns' passes, and Spark on its way to the JVM, a fixed amount."""
    columns = tuple(columns)
    size = int(settings["consume_batch_size"])
    pending: list[tuple[OffsetRange, list[Any]]] = []
    rows = 0
    with collector.paused():  # a Message per record, never in a cycle
        for r, messages in read_partitions(
            kafka_config, ranges, size, settings["poll_timeout_seconds"], settings["stall_timeout_seconds"],
        ):
            pending.append((r, messages))
            rows += len(messages)
            if rows >= size:
                yield chunks_to_arrow(pending, columns, decoder, values)
                pending, rows = [], 0
        if pending:
            yield chunks_to_arrow(pending, columns, decoder, values)


def _read_tasks(kafka_config: dict[str, Any], tasks: list[list[tuple]], settings: dict[str, float], columns: tuple,
                decoder: Decoder | None, values: str, progress=None):
    def read(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The worker's modules are never garbage: frozen, the collector stops walking them every few
        # hundred Messages (15% of a reader's CPU).
        gc.freeze()
        for batch in numbers:
            for number in batch.column("id").to_pylist():
                timings.mark("task_start", task=number)
                ranges = [OffsetRange(t, p, lo, hi, range_id=rid) for rid, t, p, lo, hi in tasks[number]]
                records = 0
                for arrow in read_task(kafka_config, ranges, settings, columns, decoder, values):
                    records += arrow.num_rows
                    yield arrow
                if progress is not None:
                    progress[0].add(records)
                    progress[1].add(len(ranges))
                timings.mark("task_end", task=number)

    return read


def read_ranges(spark, kafka_config: dict[str, Any], tasks: list[list[OffsetRange]], settings: ReadSettings,
                columns: Iterable[str] = ALL_COLUMNS, progress=None, decoder: Decoder | None = None,
                values: str = "all"):
    """A DataFrame of the records of the given packed tasks (lists of (sub-)ranges), one Spark
    partition per task, with the given record columns and the decoder's (`transform.parse_records`
    decodes what a JSON decoder left), and the values as `values` says (VALUES). `progress`, a pair of
    Spark accumulators, adds up the records and the (sub-)ranges each finished task read (for
    progress lines)."""
    if not tasks or not all(tasks):
        raise ValueError("read_ranges needs at least one task, and no empty one")
    columns = tuple(c for c in ALL_COLUMNS if c in set(columns))
    plain = [[(r.range_id, r.topic, r.partition, r.from_offset, r.until_offset) for r in task] for task in tasks]
    numbers = spark.range(0, len(plain), 1, len(plain))
    return numbers.mapInArrow(_read_tasks(kafka_config, plain, settings.model_dump(), columns, decoder, values,
                                          progress), record_schema(columns, decoder, values))
