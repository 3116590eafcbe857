"""Decoded records as Arrow columns, for every binary format (Avro, Protobuf): each type of a reader
view says what Arrow type its decoded Python values take, what Arrow and Spark types it ends as, and
the conversions between. Code here runs on executors: pyarrow only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

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


def spread(missing: Sequence[bool]) -> pa.Array:
    """Indexes that spread the rows of the present records over all of them (null where one is missing):
    `column.take(spread(missing))`."""
    positions, row = [], 0
    for gone in missing:
        positions.append(None if gone else row)
        row += not gone
    return pa.array(positions, pa.int64())


class Undecodable(Exception):
    """A payload its format cannot read; the message is the record's reason, whole."""


class DecodedColumn:
    """Binary payloads of one side of a record (its value, `side` "value", or its key) decoded by a
    format (formats.avro.AvroColumn, formats.protobuf.ProtobufColumn): as the format's view (column
    `decoded_column(side)`), or why not (`error_column(side)`), and the id of the schema that wrote
    it (`schema_id_column(side)`, Confluent framing only). `registry`: the Schema Registry client's
    settings, None for the plain binary. A format gives its view, how a registered writer schema is
    parsed, how one payload is read, and how read values become Arrow."""

    kind: ClassVar[str]  # the registry's name of the format's schemas (AVRO, PROTOBUF)

    def __init__(self, registry: dict | None, side: str):
        self.registry, self.side = registry, side
        self.name, self.error, self.schema_id = decoded_column(side), error_column(side), schema_id_column(side)
        self._view = None

    @property
    def view(self):
        if self._view is None:  # built on the executor, once per decoder
            self._view = self._load_view()
        return self._view

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_view": None}

    def columns(self) -> list[tuple[str, pa.DataType, str]]:
        return [(self.name, self.view.type.arrow, self.view.type.spark), (self.error, pa.string(), "string"),
                (self.schema_id, pa.int32(), "int")]

    def _load_view(self):
        raise NotImplementedError

    def _parse_writer(self, text: str, references: dict[str, str]) -> Any:
        """A registered writer schema, as `_read` takes it (cached per worker by registry.fetch)."""
        raise NotImplementedError

    def _read(self, payload: bytes, start: int, ident: int | None, writer: Any) -> Any:
        """One payload's value, its format's bytes from `start` (after the header); `ident` and `writer`
        None for the plain binary. Undecodable: why not."""
        raise NotImplementedError

    def _to_arrow(self, values: list[Any]) -> pa.Array:
        raise NotImplementedError

    def decode(self, payloads: Sequence[bytes | None]) -> list[pa.Array]:
        from kafka_batch.formats import registry

        n = len(payloads)
        values: list[Any] = [None] * n
        errors: list[str | None] = [None] * n
        ids: list[int | None] = [None] * n
        writers: dict[int, Any] = {}  # per schema id in this chunk: its parsed writer schema, or why not
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            start, ident, writer = 0, None, None
            if self.registry is not None:
                problem = registry.header_problem(payload)
                if problem is not None:
                    errors[i] = f"{self.side} {problem}"
                    continue
                ident = ids[i] = registry.schema_id(payload)
                writer = writers.get(ident)
                if writer is None:
                    try:
                        writer = writers[ident] = registry.fetch(self.registry, ident, self.kind, self._parse_writer)
                    except registry.UnknownSchema as exc:
                        writer = writers[ident] = Undecodable(f"{self.side}: {exc}")
                if isinstance(writer, Undecodable):
                    errors[i] = str(writer)
                    continue
                start = registry.HEADER_BYTES
            try:
                values[i] = self._read(payload, start, ident, writer)
            except Undecodable as exc:
                errors[i] = str(exc)
        return [self._to_arrow(values), pa.array(errors, pa.string()), pa.array(ids, pa.int32())]


class Decoded:
    """The reader's decoder of a binary pipeline (see kafka_batch.spark.reader): its values, and its keys
    when the pipeline decodes them too; each side a DecodedColumn."""

    def __init__(self, value, key=None):
        self.value, self.key = value, key

    def columns(self) -> list[tuple[str, pa.DataType, str]]:
        return self.value.columns() + (self.key.columns() if self.key is not None else [])

    def decode(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> list[pa.Array]:
        return self.value.decode(values) + (self.key.decode(keys) if self.key is not None else [])

    @staticmethod
    def replaces_values(decoded: list[pa.Array]) -> bool:
        """Never: its values are decoded record by record, and a chunk may mix decoded values and values
        that did not decode (the reader leaves out only whole chunks of values)."""
        return False
