"""Protobuf values: the pipeline's reader view (a message of a .proto file), its Spark and Arrow types,
and decoding records into Arrow.

The view is compiled once where the definition is loaded (protoc, from grpcio-tools) into a
FileDescriptorSet; executors get that set and need only the protobuf runtime. A record is parsed as the
view's message whatever version wrote it, by Protobuf's own rules: fields the view does not know are
skipped, fields the writer did not set read as their defaults (null where the field tracks presence:
`optional`, oneof members, messages). In the Confluent wire format, the header's message indexes must
name the view's message in the writer schema (fetched once per id); a record naming another message
is invalid.

Types follow Spark's `from_protobuf`: messages are structs, repeated fields arrays, maps maps, enums
their value names, `google.protobuf.Timestamp` a timestamp, the wrapper types (`Int64Value`, ...)
nullable values, unsigned 64-bit integers decimal(20,0).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message_factory import GetMessageClass

from kafka_batch.formats.columns import (
    ColumnType,
    DecodedColumn,
    Undecodable,
    in_list,
    scaled,
    spread,
    struct_of,
    values_to_arrow,
)

_SCALARS = {
    FieldDescriptor.TYPE_INT32: (pa.int32(), "int"), FieldDescriptor.TYPE_SINT32: (pa.int32(), "int"),
    FieldDescriptor.TYPE_SFIXED32: (pa.int32(), "int"), FieldDescriptor.TYPE_INT64: (pa.int64(), "bigint"),
    FieldDescriptor.TYPE_SINT64: (pa.int64(), "bigint"), FieldDescriptor.TYPE_SFIXED64: (pa.int64(), "bigint"),
    FieldDescriptor.TYPE_UINT32: (pa.int64(), "bigint"), FieldDescriptor.TYPE_FIXED32: (pa.int64(), "bigint"),
    FieldDescriptor.TYPE_FLOAT: (pa.float32(), "float"), FieldDescriptor.TYPE_DOUBLE: (pa.float64(), "double"),
    FieldDescriptor.TYPE_BOOL: (pa.bool_(), "boolean"), FieldDescriptor.TYPE_STRING: (pa.string(), "string"),
    FieldDescriptor.TYPE_BYTES: (pa.binary(), "binary"),
}
_UNSIGNED_64 = (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64)
_WRAPPERS = {f"google.protobuf.{name}" for name in (
    "DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value", "BoolValue",
    "StringValue", "BytesValue")}
_TIMESTAMP = "google.protobuf.Timestamp"


# A view compiles in about a second (most of it the child's start); a far longer wait is a stuck child.
PROTOC_TIMEOUT_S = 120


class ProtoProblem(ValueError):
    """A view that does not compile, or a message this project cannot map."""


def compile_proto(text: str, cache: Path | None = None) -> bytes:
    """The .proto text compiled (with the well-known types it imports) into a serialized
    FileDescriptorSet; kept in the directory `cache` by the text's hash, since a definition is loaded
    often (protoc takes a tenth of a second)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    cached = None if cache is None else cache / f"{digest}.pb"
    if cached is not None and cached.exists():
        return cached.read_bytes()
    with tempfile.TemporaryDirectory(prefix="kafka_batch_proto_") as directory:
        (Path(directory) / "view.proto").write_text(text)
        out = Path(directory) / "view.pb"
        # In a child process: protoc writes its errors to the process's stderr, not to Python.
        try:
            result = subprocess.run(
                [sys.executable, "-c", "import os, sys; from grpc_tools import protoc;"
                 " sys.exit(protoc.main(['protoc', f'-I{sys.argv[1]}', f'-I{os.path.dirname(protoc.__file__)}/_proto',"
                 " f'--descriptor_set_out={sys.argv[2]}', '--include_imports', 'view.proto']))",
                 directory, str(out)], capture_output=True, text=True, timeout=PROTOC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ProtoProblem(f"protoc did not compile the view within {PROTOC_TIMEOUT_S} s") from None
        if result.returncode != 0:
            raise ProtoProblem(" ".join(result.stderr.replace(f"{directory}/", "").split()) or "protoc failed")
        data = out.read_bytes()
    if cached is None:
        return data
    cached.parent.mkdir(parents=True, exist_ok=True)
    # A file of this process's own, renamed into place: processes loading the definition at once (the
    # DAG processor, a CLI, a job) never see one another's partial writes.
    with tempfile.NamedTemporaryFile(dir=cached.parent, prefix=f"{digest}.", suffix=".tmp", delete=False) as partial:
        partial.write(data)
    Path(partial.name).replace(cached)
    return data


def _pool(descriptor_set: bytes) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(file)
    return pool


def first_message(descriptor_set: bytes) -> str:
    """The full name of the first message of the compiled file (the last one of the set: imports come first)."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
    view = files[-1]
    if not view.message_type:
        raise ProtoProblem("the .proto file defines no message")
    return ".".join(p for p in (view.package, view.message_type[0].name) if p)


class _Mapper:
    def __init__(self) -> None:
        self.active: set[str] = set()

    def message(self, descriptor: Descriptor) -> ColumnType:
        if descriptor.full_name in self.active:
            raise ProtoProblem(f"message {descriptor.full_name} contains itself: Spark has no recursive types")
        self.active.add(descriptor.full_name)
        fields = [(f.name, self.field(f)) for f in descriptor.fields]
        self.active.discard(descriptor.full_name)
        kind = struct_of(fields)
        getters = [(f.name, _getter(f)) for f in descriptor.fields]

        def extract(message: Any) -> dict:
            return {name: get(message) for name, get in getters}

        return ColumnType(kind.decoded, kind.arrow, kind.spark, adapt=kind.adapt, convert=kind.convert,
                          members=kind.members, extract=extract)

    def field(self, field: FieldDescriptor) -> ColumnType:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = (self.single(f) for f in field.message_type.fields)
            if value.convert is not None or value.adapt is not None:
                raise ProtoProblem(f"field {field.full_name}: a map of timestamps or messages is not supported")
            return ColumnType(pa.map_(key.decoded, value.decoded), pa.map_(key.arrow, value.arrow),
                              f"map<{key.spark},{value.spark}>")
        one = self.single(field)
        if not field.is_repeated:
            return one
        adapt = None if one.adapt is None else (lambda values, a=one.adapt: [a(v) for v in values])
        return ColumnType(pa.list_(one.decoded), pa.list_(one.arrow), f"array<{one.spark}>", adapt=adapt,
                          convert=None if one.convert is None else in_list(one.convert))

    def single(self, field: FieldDescriptor) -> ColumnType:
        """The type of one value of the field (an element, for a repeated one)."""
        if field.type == FieldDescriptor.TYPE_ENUM:
            return ColumnType(pa.string(), pa.string(), "string")
        if field.type in _UNSIGNED_64:
            return ColumnType(pa.decimal128(20, 0), pa.decimal128(20, 0), "decimal(20,0)")
        if field.type in _SCALARS:
            arrow, spark = _SCALARS[field.type]
            return ColumnType(arrow, arrow, spark)
        name = field.message_type.full_name
        if name == _TIMESTAMP:
            return ColumnType(pa.int64(), pa.timestamp("us", tz="UTC"), "timestamp",
                              convert=scaled(pa.timestamp("us", tz="UTC"), 1))
        if name in _WRAPPERS:
            return self.single(field.message_type.fields_by_name["value"])
        return self.message(field.message_type)


def _value(field: FieldDescriptor) -> Callable[[Any], Any]:
    """A value of the field (an element of a repeated one) as its column takes it."""
    if field.type == FieldDescriptor.TYPE_ENUM:
        names = {v.number: v.name for v in field.enum_type.values}
        return lambda number: names.get(number, str(number))
    if field.type in _UNSIGNED_64:
        return Decimal
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return lambda v: v
    name = field.message_type.full_name
    if name == _TIMESTAMP:
        return lambda t: t.seconds * 1_000_000 + t.nanos // 1000
    if name in _WRAPPERS:
        return lambda wrapper: wrapper.value
    nested = _Mapper().message(field.message_type).extract
    return nested


def _getter(field: FieldDescriptor) -> Callable[[Any], Any]:
    """The field of a parsed message, as its column takes it (None where the field tracks presence and is unset)."""
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_field, value_field = field.message_type.fields
        value = _value(value_field)
        return lambda m: [(k, value(v)) for k, v in getattr(m, name).items()]
    value = _value(field)
    plain = field.type not in (FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_MESSAGE) and field.type not in _UNSIGNED_64
    if field.is_repeated:
        return (lambda m: list(getattr(m, name))) if plain else (lambda m: [value(v) for v in getattr(m, name)])
    if field.has_presence:
        return lambda m: value(getattr(m, name)) if m.HasField(name) else None
    return (lambda m: getattr(m, name)) if plain else (lambda m: value(getattr(m, name)))


class ProtoView:
    """A pipeline's Protobuf reader view: its message's fields with their Spark types, and parsing."""

    def __init__(self, descriptor_set: bytes, message: str):
        self.descriptor_set, self.message = descriptor_set, message
        pool = _pool(descriptor_set)
        try:
            self.descriptor = pool.FindMessageTypeByName(message)
        except KeyError:
            raise ProtoProblem(f"no message {message!r} in the .proto file") from None
        self.type = _Mapper().message(self.descriptor)
        self.getters = [_getter(f) for f in self.descriptor.fields]
        self.parse = GetMessageClass(self.descriptor).FromString

    @property
    def fields(self) -> dict[str, str]:
        return {name: t.spark for name, t in self.type.members}

    def messages_to_arrow(self, messages: Sequence[Any]) -> pa.Array:
        """Parsed messages (None: none) as one struct column, field by field straight off the messages
        (no dict per message; a nested message's column is built from its dicts)."""
        kind = self.type
        if not messages:
            return values_to_arrow(kind, [])
        missing = [m is None for m in messages]
        present = [m for m in messages if m is not None] if any(missing) else messages
        rows = spread(missing) if len(present) < len(messages) else None  # the present rows over the records
        children = []
        for (_, field), get in zip(kind.members, self.getters, strict=True):
            column = values_to_arrow(field, [get(m) for m in present])
            children.append(column if rows is None else column.take(rows))
        return pa.StructArray.from_arrays(children, fields=list(kind.arrow),
                                          mask=pa.array(missing) if any(missing) else None)


def message_indexes(payload: bytes, start: int) -> tuple[list[int], int]:
    """The Confluent wire format's message indexes at `start` (zigzag varints: a count, then the
    indexes; a count of 0 means [0], the file's first message), and where the message begins."""
    def varint(at: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            if at >= len(payload):
                raise ValueError("the message indexes are cut short")
            byte = payload[at]
            result |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1), at
            shift += 7
            if shift > 63:
                raise ValueError("a message index is not a varint")

    count, at = varint(start)
    if count == 0:
        return [0], at
    if not 0 < count <= 100:
        raise ValueError(f"{count} message indexes")
    indexes = []
    for _ in range(count):
        index, at = varint(at)
        indexes.append(index)
    return indexes, at


def writer_messages(text: str, references: dict[str, str]) -> dict[tuple[int, ...], str]:
    """A registered Protobuf schema (the serialized form, base64 of a FileDescriptorProto): the full
    name of the message at each index path."""
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.standard_b64decode(text))
    names: dict[tuple[int, ...], str] = {}

    def walk(messages, path: tuple[int, ...], prefix: str) -> None:
        for i, message in enumerate(messages):
            full = f"{prefix}.{message.name}" if prefix else message.name
            names[(*path, i)] = full
            walk(message.nested_type, (*path, i), full)

    walk(file.message_type, (), file.package)
    return names


class ProtobufColumn(DecodedColumn):
    """Protobuf bytes of one side of a record decoded (formats.columns.DecodedColumn); in the Confluent
    wire format the message indexes must name the view's message in the writer schema."""

    kind = "PROTOBUF"

    def __init__(self, descriptor_set: bytes, message: str, registry: dict | None, side: str = "value"):
        super().__init__(registry, side)
        self.descriptor_set, self.message = descriptor_set, message

    def _load_view(self) -> ProtoView:
        return ProtoView(self.descriptor_set, self.message)

    def _parse_writer(self, text: str, references: dict[str, str]) -> dict[tuple[int, ...], str]:
        return writer_messages(text, references)

    def _read(self, payload: bytes, start: int, ident: int | None, writer: dict | None) -> Any:
        where = ""
        if writer is not None:
            try:
                indexes, start = message_indexes(payload, start)
            except ValueError as exc:
                raise Undecodable(f"{self.side}: schema id {ident}: {exc}") from None
            where = f"schema id {ident}: "
            named = writer.get(tuple(indexes))
            if named != self.message:
                raise Undecodable(f"{self.side}: message index {indexes} of schema id {ident} is"
                                  f" {named or 'no message'}; the pipeline reads {self.message}")
        try:
            return self.view.parse(payload[start:] if start else payload)
        except Exception as exc:  # noqa: BLE001 - the runtime's DecodeError, and others on bad bytes
            raise Undecodable(f"{self.side}: {where}undecodable Protobuf payload"
                              f" ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None

    def _to_arrow(self, values: list[Any]) -> pa.Array:
        return self.view.messages_to_arrow(values)
