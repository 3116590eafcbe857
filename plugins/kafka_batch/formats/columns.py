"""Decoded records as Arrow columns, for every binary format (Avro, Protobuf): each type of a reader
view says what Arrow type its decoded Python values take, what Arrow and Spark types it ends as, and
the conversions between. Code here runs on executors: pyarrow only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class ColumnType:
    """One type of a reader view: the Arrow type its decoded values go into, the Arrow type and Spark type it
    ends as, how a decoded Python value becomes what Arrow takes (None: as it is), and the
    per-column conversion after (None: none)."""

    decoded: pa.DataType
    arrow: pa.DataType
    spark: str
    nullable: bool = False
    adapt: Callable[[Any], Any] | None = None
    convert: Callable[[pa.Array], pa.Array] | None = None
    members: tuple[tuple[str, ColumnType], ...] = ()  # a record's fields
    extract: Callable[[Any], Any] | None = None  # a parsed message -> its decoded value (Protobuf)


def scaled(arrow: pa.DataType, factor: int) -> Callable[[pa.Array], pa.Array]:
    def convert(numbers: pa.Array) -> pa.Array:
        if factor != 1:
            numbers = pc.multiply(numbers, factor)
        return numbers.cast(arrow)
    return convert


def in_list(convert: Callable[[pa.Array], pa.Array]) -> Callable[[pa.Array], pa.Array]:
    def converted(array: pa.Array) -> pa.Array:
        values = convert(array.values)
        return pa.ListArray.from_arrays(array.offsets, values, mask=array.is_null())
    return converted


def in_struct(arrow: pa.StructType, converts: list) -> Callable[[pa.Array], pa.Array]:
    def converted(array: pa.StructArray) -> pa.StructArray:
        children = [array.field(i) if c is None else c(array.field(i)) for i, c in enumerate(converts)]
        return pa.StructArray.from_arrays(children, fields=list(arrow), mask=array.is_null())
    return converted


def struct_of(fields: list[tuple[str, ColumnType]]) -> ColumnType:
    """The struct of these named fields (a record, a message)."""
    decoded = pa.struct([pa.field(n, t.decoded) for n, t in fields])
    arrow = pa.struct([pa.field(n, t.arrow) for n, t in fields])
    spark = "struct<" + ",".join(f"{backquoted(n)}:{t.spark}" for n, t in fields) + ">"
    adapters = [(n, t.adapt) for n, t in fields if t.adapt is not None]
    adapt = None
    if adapters:
        def adapt(record, adapters=adapters):
            if record is None:
                return None
            for name, one in adapters:
                record[name] = one(record[name])
            return record
    converts = [t.convert for _, t in fields]
    convert = None if not any(converts) else in_struct(arrow, converts)
    return ColumnType(decoded, arrow, spark, adapt=adapt, convert=convert, members=tuple(fields))


def backquoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def values_to_arrow(kind: ColumnType, values: Sequence[Any]) -> pa.Array:
    """Decoded values (None: none) as one column of `kind`'s final type."""
    if kind.adapt is not None:
        values = [kind.adapt(v) for v in values]
    decoded = kind.decoded
    if pa.types.is_struct(decoded) and values:
        # Column by column (a third of the time of converting the records as structs).
        fields = list(decoded)
        missing = [v is None for v in values]
        rows = pa.RecordBatch.from_pylist([{} if v is None else v for v in values] if any(missing) else values,
                                          schema=pa.schema(fields))
        array = pa.StructArray.from_arrays(rows.columns, fields=fields, mask=pa.array(missing) if any(missing) else None)
    else:
        array = pa.array(values, decoded)
    return kind.convert(array) if kind.convert is not None else array


def decoded_column(side: str) -> str:
    """The reader's column of the decoded value (`side` "value") or key ("key")."""
    return f"_{side}_decoded"


def error_column(side: str) -> str:
    """The reader's column of why a value or key could not be decoded (null when it could)."""
    return f"_{side}_decode_error"


def schema_id_column(side: str) -> str:
    """The reader's column of the id of the schema that wrote a value or key (the Confluent wire format)."""
    return f"_{side}_schema_id"


class Decoded:
    """The reader's decoder of a binary pipeline (see kafka_batch.spark.reader): its values, and its keys
    when the pipeline decodes them too; each side an AvroColumn or a ProtobufColumn."""

    def __init__(self, value, key=None):
        self.value, self.key = value, key

    def columns(self) -> list[tuple[str, pa.DataType, str]]:
        return self.value.columns() + (self.key.columns() if self.key is not None else [])

    def decode(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> list[pa.Array]:
        return self.value.decode(values) + (self.key.decode(keys) if self.key is not None else [])
