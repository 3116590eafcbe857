"""A pipeline's JSON fields parsed in the reader, with pyarrow: a fast path for Spark's from_json.

from_json was about half of the JVM's work per record (1.7 us); pyarrow's parser, in the Python
task that already holds the values, costs 0.4-0.8 us. It is a fast path, never the definition: a
chunk of values is parsed here only when pyarrow reads each value as exactly one JSON object with
the declared field types. Any other chunk (a malformed, mistyped or non-object value, a value over
`FAST_MAX_VALUE_BYTES`, a timestamp field) is left whole to from_json in `transform.parse_records`,
whose rules then decide every record of it. On the values pyarrow accepts, both give the same fields:
tests/integration/test_json_fields.py compares them value by value, on edge cases, against Spark.

Why each value is one row: the chunk is parsed as newline-delimited JSON, with values that hold no
line break and each start with `{` and end with `}`. A closing `}` followed by `{` is only valid
between top-level documents, and a raw line break inside a string is invalid JSON, so a document
never spans two values; a value that holds two documents makes the row count differ. (The same
check keeps away a top-level `null`, on which pyarrow 26's parser crashes the process.)
Code here runs on executors: pyarrow and numpy only.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from kafka_batch.formats.columns import spread

# The field types pyarrow converts as Spark's from_json does (a timestamp's formats differ: Spark's).
ARROW_TYPES = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
               "boolean": pa.bool_()}
# Longer values go to from_json: Jackson, under it, refuses documents nested over 1,000 levels and
# numbers over 1,000 digits, which pyarrow reads; neither fits in 1,000 bytes.
FAST_MAX_VALUE_BYTES = 1_000
_OPEN, _CLOSE = ord("{"), ord("}")
PARSED = "_parsed_in_reader"  # true on the records whose fields the reader parsed


def field_column(name: str) -> str:
    return f"_json_{name}"


def parses_in_reader(fields: Mapping[str, str]) -> bool:
    return all(ftype in ARROW_TYPES for ftype in fields.values())


def columns(fields: Mapping[str, str]) -> list[tuple[str, pa.DataType, str]]:
    """The columns the reader adds: (name, Arrow type, Spark type; a field's type is Spark's name for it,
    as in the schema from_json gets)."""
    return [(PARSED, pa.bool_(), "boolean"), *[(field_column(n), ARROW_TYPES[t], t) for n, t in fields.items()]]


def parse_values(values: Sequence[bytes | None], fields: Mapping[str, str]) -> list[pa.Array]:
    """The columns of `columns(fields)` for these values: the parsed fields, or nulls with PARSED
    false when the chunk must go to from_json. A tombstone (None) has null fields."""
    n = len(values)
    present = [v for v in values if v is not None] if None in values else values
    parsed = _parse(present, fields)
    if parsed is None:
        return [pa.repeat(pa.scalar(False), n), *[pa.nulls(n, ARROW_TYPES[t]) for t in fields.values()]]
    if len(present) < n:  # tombstones: spread the parsed rows over the records that have a value
        rows = spread([v is None for v in values])
        parsed = [column.take(rows) for column in parsed]
    return [pa.repeat(pa.scalar(True), n), *parsed]


class JsonFields:
    """The reader's decoder for a JSON pipeline (see kafka_batch.spark.reader): `columns` and `parse_values`."""

    def __init__(self, fields: Mapping[str, str]):
        if not parses_in_reader(fields):
            raise ValueError(f"fields of types pyarrow cannot parse as Spark does: {dict(fields)}")
        self.fields = dict(fields)

    def columns(self) -> list[tuple[str, pa.DataType, str]]:
        return columns(self.fields)

    def decode(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> list[pa.Array]:
        return parse_values(values, self.fields)

    @staticmethod
    def replaces_values(decoded: list[pa.Array]) -> bool:
        """A chunk parsed here: its fields are all that is read of its values (a chunk is parsed whole)."""
        parsed = decoded[0]
        return len(parsed) > 0 and parsed[0].as_py()


def _parse(values: Sequence[bytes], fields: Mapping[str, str]) -> list[pa.Array] | None:
    n = len(values)
    if not n:
        return [pa.nulls(0, ARROW_TYPES[t]) for t in fields.values()]
    lengths = np.fromiter(map(len, values), np.int64, n)
    if lengths.min() < 2 or lengths.max() > FAST_MAX_VALUE_BYTES:
        return None
    joined = b"\n".join(values)
    if joined.count(b"\n") != n - 1 or b"\r" in joined:  # a line break in a value
        return None
    # Each value starts with `{` and ends with `}`: its first and last bytes, looked up in C.
    text = np.frombuffer(joined, np.uint8)
    starts = np.zeros(n, np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    if not ((text[starts] == _OPEN).all() and (text[starts + lengths - 1] == _CLOSE).all()):
        return None
    schema = pa.schema([(name, ARROW_TYPES[ftype]) for name, ftype in fields.items()])
    try:
        if not joined.isascii():
            joined.decode()  # pyarrow would keep invalid UTF-8 in a string field; Spark's parser refuses it
        table = pa_json.read_json(
            io.BytesIO(joined),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(joined) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowException, ValueError):  # not JSON, a mistyped field, a duplicate name, bad UTF-8
        return None
    if table.num_rows != n:
        return None
    return [column.combine_chunks() for column in table.columns]
