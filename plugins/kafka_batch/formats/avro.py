"""Avro values: the pipeline's reader view, its Spark and Arrow types, and decoding records into Arrow.

The reader view is the Avro schema a pipeline gives (`record.schema`): what every record is read as,
whatever schema wrote it. Records are resolved from their writer schema to the reader view by the
Avro rules (fastavro): added fields take their defaults, removed fields vanish, promotions apply; a
writer schema that cannot give a field the view requires makes its records invalid, with the reason.

Types follow Spark's own Avro mapping: records are structs (so `address.city` reaches a nested field),
a union with null is a nullable value, any other union is a struct of `member0`, `member1`, ...,
enums are strings, maps have string keys, `timestamp-*` are timestamps (`local-timestamp-*` without a
zone), `date` is a date, `decimal` a decimal. Decoding leaves the logical types it can convert in bulk
as their numbers (a Python datetime per record would cost as much as the decoding) and converts the
Arrow columns afterwards. Code here runs on executors: fastavro and pyarrow only.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_reader
from fastavro.read import SchemaResolutionError
from fastavro.schema import to_parsing_canonical_form

from kafka_batch.formats.columns import (
    ColumnType,
    DecodedColumn,
    Undecodable,
    in_list,
    scaled,
    struct_of,
    values_to_arrow,
)

PRIMITIVES = {
    "boolean": (pa.bool_(), "boolean"), "int": (pa.int32(), "int"), "long": (pa.int64(), "bigint"),
    "float": (pa.float32(), "float"), "double": (pa.float64(), "double"), "bytes": (pa.binary(), "binary"),
    "string": (pa.string(), "string"),
}
# Logical types decoded as their number and converted per column: (Arrow type decoded, type converted, Spark).
NUMERIC_LOGICAL = {
    "timestamp-millis": (pa.int64(), pa.timestamp("us", tz="UTC"), "timestamp", 1000),
    "timestamp-micros": (pa.int64(), pa.timestamp("us", tz="UTC"), "timestamp", 1),
    "local-timestamp-millis": (pa.int64(), pa.timestamp("us"), "timestamp_ntz", 1000),
    "local-timestamp-micros": (pa.int64(), pa.timestamp("us"), "timestamp_ntz", 1),
    "date": (pa.int32(), pa.date32(), "date", 1),
}
# Logical types kept as their underlying type (Spark has no time of day; a uuid is its string).
PLAIN_LOGICAL = ("time-millis", "time-micros", "uuid")


class SchemaProblem(ValueError):
    """A reader view that is not a valid Avro record schema this project can map."""


def _named(schema: Any, namespace: str | None) -> str:
    """A named type's full name: its own namespace, else the enclosing one (Avro's rule)."""
    name = schema["name"]
    namespace = schema.get("namespace", namespace)
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _Mapper:
    """Walks a schema once, resolving named types; refuses what Spark cannot hold (recursion)."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.active: set[str] = set()

    def map(self, schema: Any, namespace: str | None = None) -> ColumnType:
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return ColumnType(PRIMITIVES[schema][0], PRIMITIVES[schema][0], PRIMITIVES[schema][1])
            if schema == "null":
                return ColumnType(pa.null(), pa.null(), "void", nullable=True)
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            target = self.named.get(full) or self.named.get(schema)
            if target is None:
                raise SchemaProblem(f"unknown type {schema!r}")
            return self.map(target, namespace)
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical in NUMERIC_LOGICAL and kind in ("int", "long"):
            decoded, arrow, spark, factor = NUMERIC_LOGICAL[logical]
            return ColumnType(decoded, arrow, spark, convert=scaled(arrow, factor))
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if precision > 38:
                raise SchemaProblem(f"decimal precision {precision} is over 38, Spark's largest")
            if kind == "fixed":
                self._define(schema, namespace)
            arrow = pa.decimal128(precision, scale)
            return ColumnType(arrow, arrow, f"decimal({precision},{scale})")
        if kind in PRIMITIVES or kind == "null":
            return self.map(kind, namespace)
        if kind == "enum":
            self._define(schema, namespace)
            return ColumnType(pa.string(), pa.string(), "string")
        if kind == "fixed":
            self._define(schema, namespace)
            return ColumnType(pa.binary(), pa.binary(), "binary")
        if kind == "array":
            item = self.map(schema["items"], namespace)
            adapt = None if item.adapt is None else (lambda values, a=item.adapt: None if values is None else
                                                     [a(v) for v in values])
            return ColumnType(pa.list_(item.decoded), pa.list_(item.arrow), f"array<{item.spark}>", adapt=adapt,
                            convert=None if item.convert is None else in_list(item.convert))
        if kind == "map":
            value = self.map(schema["values"], namespace)
            if value.adapt is not None or value.convert is not None:
                raise SchemaProblem("a map of values with logical types or unions of several types is not supported")
            return ColumnType(pa.map_(pa.string(), value.decoded), pa.map_(pa.string(), value.arrow),
                            f"map<string,{value.spark}>")
        if kind in ("record", "error"):
            return self._record(schema, namespace)
        raise SchemaProblem(f"unknown type {kind!r}")

    def _define(self, schema: Any, namespace: str | None) -> str:
        full = _named(schema, namespace)
        self.named[full] = schema
        self.named.setdefault(schema["name"], schema)
        return full

    def _record(self, schema: Any, namespace: str | None) -> ColumnType:
        full = self._define(schema, namespace)
        if full in self.active:
            raise SchemaProblem(f"record {full} contains itself: Spark has no recursive types")
        self.active.add(full)
        inner = full.rpartition(".")[0] or None
        fields = [(f["name"], self.map(f["type"], inner)) for f in schema["fields"]]
        self.active.discard(full)
        return struct_of(fields)

    def _union(self, branches: list, namespace: str | None) -> ColumnType:
        others = [b for b in branches if b != "null"]
        nullable = len(others) < len(branches)
        if len(others) == 1:
            one = self.map(others[0], namespace)
            return ColumnType(one.decoded, one.arrow, one.spark, nullable, one.adapt, one.convert, one.members)
        mapped = [self.map(b, namespace) for b in others]
        if any(m.adapt is not None or m.convert is not None for m in mapped):
            raise SchemaProblem("a union of several types with logical types or nested unions is not supported")
        names = [f"member{i}" for i in range(len(mapped))]
        kinds = [_python_kinds(b, self) for b in others]
        arrow = pa.struct([pa.field(n, m.arrow) for n, m in zip(names, mapped, strict=True)])

        def adapt(value, names=names, kinds=kinds):
            if value is None:
                return None
            member = next(i for i, accepts in enumerate(kinds) if type(value) in accepts)
            return {names[member]: value}

        spark = "struct<" + ",".join(f"{n}:{m.spark}" for n, m in zip(names, mapped, strict=True)) + ">"
        return ColumnType(arrow, arrow, spark, nullable, adapt=adapt)


def _python_kinds(branch: Any, mapper: _Mapper) -> tuple[type, ...]:
    """What Python type fastavro decodes a union branch into (the branch a value came from)."""
    kind = branch if isinstance(branch, str) else branch["type"]
    if kind not in PRIMITIVES and kind not in ("enum", "fixed", "record", "array", "map") and isinstance(branch, str):
        return _python_kinds(mapper.named.get(kind) or mapper.named[branch], mapper)
    return {"boolean": (bool,), "int": (int,), "long": (int,), "float": (float,), "double": (float,),
            "bytes": (bytes,), "fixed": (bytes,), "string": (str,), "enum": (str,), "record": (dict,),
            "map": (dict,), "array": (list,)}[kind]


def _physical(schema: Any) -> Any:
    """The schema with the logical types converted per column (and the plain ones) left out: fastavro
    then returns their numbers, as fast as any long."""
    if isinstance(schema, list):
        return [_physical(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _physical(v) if k in ("type", "items", "values", "fields") else v for k, v in schema.items()}
    if isinstance(schema.get("fields"), list):
        out["fields"] = [{**f, "type": _physical(f["type"])} for f in schema["fields"]]
    if schema.get("logicalType") in (*NUMERIC_LOGICAL, *PLAIN_LOGICAL):
        out.pop("logicalType")
    return out


def load_schema(value: Any, record: bool = True) -> Any:
    """A schema given as a mapping or as its JSON text, checked as Avro (SchemaProblem otherwise); a
    record schema unless `record` is false (a key may be a string, a long, ...)."""
    if isinstance(value, str) and value.lstrip().startswith(("{", "[", '"')):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SchemaProblem(f"not JSON: {exc.msg}") from None
    if record and not (isinstance(value, dict) and value.get("type") == "record"):
        raise SchemaProblem("must be an Avro record schema ({type: record, name, fields})")
    try:
        parse_schema(copy.deepcopy(value))
        _Mapper().map(value)
    except SchemaProblem:
        raise
    except Exception as exc:  # noqa: BLE001 - fastavro's schema errors have no common base
        raise SchemaProblem(str(exc)) from None
    return value


class ReaderView:
    """A pipeline's reader view: its top-level fields' Spark types, and the decoding into Arrow."""

    def __init__(self, schema: Any):
        self.schema = schema
        self.type = _Mapper().map(schema)
        self.parsed = parse_schema(_physical(copy.deepcopy(schema)))
        self.canonical = to_parsing_canonical_form(self.parsed)

    @property
    def fields(self) -> dict[str, str]:
        """Each top-level field with its Spark type."""
        return {name: t.spark for name, t in self.type.members}

    def member(self, name: str) -> ColumnType | None:
        return dict(self.type.members).get(name)

    def records_to_arrow(self, records: Sequence[dict | None]) -> pa.Array:
        """Decoded records (None: no record) as one column of the view's final types."""
        return values_to_arrow(self.type, records)


# Types a record decodes alike whichever schema reads it, when both give the same one: no named type in
# them, so no definition of one can differ between the writer and the view.
_UNNAMED = ("null", *PRIMITIVES)
_SCALARS = (type(None), bool, int, float, str, bytes)


def _unnamed(schema: Any) -> bool:
    if isinstance(schema, str):
        return schema in _UNNAMED
    if isinstance(schema, list):
        return all(_unnamed(branch) for branch in schema)
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "array":
            return _unnamed(schema["items"])
        if kind == "map":
            return _unnamed(schema["values"])
        return kind in _UNNAMED
    return False


def defaults_to_add(writer: Any, view: Any) -> dict[str, Any] | None:
    """All that reading a record written with `writer` as `view` changes (both parsed), when that is
    adding the view's fields the writer lacks, each with its default: both records of one name, no
    aliases, every field they share of one type without named types, every default a scalar. The usual
    evolution (a field added with a default) is so; fastavro's resolution rebuilds its field maps for
    every record and doubles a record's decoding. None: reading it takes fastavro's resolution."""
    if not (isinstance(writer, dict) and isinstance(view, dict) and writer.get("type") == view.get("type") == "record"
            and writer.get("name") == view.get("name") and "aliases" not in view):
        return None
    written = {field["name"]: field["type"] for field in writer["fields"]}
    defaults = {}
    for field in view["fields"]:
        name = field["name"]
        if "aliases" in field:
            return None
        if name in written:
            if written[name] != field["type"] or not _unnamed(field["type"]):
                return None
        elif "default" in field and isinstance(field["default"], _SCALARS):
            defaults[name] = field["default"]  # what fastavro's resolution sets
        else:
            return None
    return defaults


def decode(payload: bytes, start: int, writer: Any, reader: Any) -> dict:
    """One Avro datum from `payload[start:]`, written with `writer`, read as `reader` (None: the
    writer itself); every byte must belong to it (trailing bytes are an error, not ignored)."""
    buffer = io.BytesIO(payload)
    buffer.seek(start)
    record = schemaless_reader(buffer, writer, reader)
    if buffer.tell() != len(payload):
        raise ValueError(f"{len(payload) - buffer.tell()} byte(s) after the record")
    return record


class AvroColumn(DecodedColumn):
    """Avro bytes of one side of a record decoded (formats.columns.DecodedColumn); the plain binary is
    written with the view itself."""

    kind = "AVRO"

    def __init__(self, schema: Any, registry: dict | None, side: str = "value"):
        super().__init__(registry, side)
        self.schema = schema
        self._defaults: dict[int, dict[str, Any] | None] = {}  # per writer schema id: defaults_to_add

    def _load_view(self) -> ReaderView:
        return ReaderView(self.schema)

    def _parse_writer(self, text: str, references: dict[str, str]) -> tuple[Any, str]:
        """A registered writer schema (with the named types it references), its logical types left out as
        the view's are, and its canonical form. Cached per worker for every pipeline: nothing of the view."""
        named: dict[str, Any] = {}
        for reference in references.values():
            parse_schema(_physical(json.loads(reference)), named_schemas=named)
        parsed = parse_schema(_physical(json.loads(text)), named_schemas=named)
        return parsed, to_parsing_canonical_form(parsed)

    def _read(self, payload: bytes, start: int, ident: int | None, writer: tuple[Any, str] | None) -> Any:
        if writer is None:
            try:
                return decode(payload, start, self.view.parsed, None)
            except Exception as exc:  # noqa: BLE001 - fastavro raises many kinds on bad bytes
                raise Undecodable(f"undecodable Avro {self.side} ({_reason(exc)})") from None
        parsed, canonical = writer
        view = self.view
        if ident not in self._defaults:  # once per writer schema met
            self._defaults[ident] = {} if canonical == view.canonical else defaults_to_add(parsed, view.parsed)
        defaults = self._defaults[ident]
        try:  # resolved by fastavro only when reading as the view takes more than adding defaults
            record = decode(payload, start, parsed, None if defaults is not None else view.parsed)
            if defaults:
                record.update(defaults)
            return record
        except SchemaResolutionError as exc:  # names the field the writer schema cannot give
            raise Undecodable(f"{self.side}: schema id {ident} cannot be read as the pipeline's schema:"
                              f" {' '.join(str(exc).split())}") from None
        except Exception as exc:  # noqa: BLE001 - as above
            raise Undecodable(f"{self.side}: schema id {ident}: undecodable Avro payload ({_reason(exc)})") from None

    def _to_arrow(self, values: list[Any]) -> pa.Array:
        return self.view.records_to_arrow(values)


def _reason(exc: Exception) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
