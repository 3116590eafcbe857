"""The Avro reader view (kafka_batch.formats.avro): Spark and Arrow types, decoding, what it refuses.
Pure logic; the records are written with fastavro here and compared with what was written."""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from kafka_batch.formats.avro import AvroColumn, ReaderView, SchemaProblem, load_schema

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": None}]}]},
    {"name": "tag", "type": ["int", "string", "boolean"]},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "DONE"]}},
    {"name": "times", "type": {"type": "array", "items": {"type": "long", "logicalType": "timestamp-micros"}}},
    {"name": "attrs", "type": {"type": "map", "values": "string"}},
    {"name": "billing", "type": ["null", "Address"], "default": None},
]}
AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def _bytes(schema, record) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, parse_schema(schema), record)
    return buffer.getvalue()


def _order(i: int) -> dict:
    return {"id": i, "at": AT, "local": datetime(2026, 1, 2, 3, 4, 5, 6), "day": date(2026, 2, 3),
            "amount": Decimal("-12.34"), "address": None if i % 2 else {"city": "Oslo", "zip": None},
            "tag": [7, "seven", True][i % 3], "status": "DONE", "times": [AT], "attrs": {"a": "b"},
            "billing": {"city": "Lima", "zip": "15001"}}


def test_types_follow_sparks_avro_mapping():
    assert ReaderView(ORDER).fields == {
        "id": "bigint", "at": "timestamp", "local": "timestamp_ntz", "day": "date", "amount": "decimal(10,2)",
        "address": "struct<`city`:string,`zip`:string>", "tag": "struct<member0:int,member1:string,member2:boolean>",
        "status": "string", "times": "array<timestamp>", "attrs": "map<string,string>",
        "billing": "struct<`city`:string,`zip`:string>",
    }


def test_plain_values_decode_into_the_views_arrow_types():
    column = AvroColumn(ORDER, None)
    decoded, errors, ids = column.decode([_bytes(ORDER, _order(i)) for i in range(3)] + [None, b"\x02"])
    assert decoded.type == column.view.type.arrow
    rows = decoded.to_pylist()
    assert rows[3] is None and errors.to_pylist()[:4] == [None] * 4 and ids.to_pylist() == [None] * 5
    assert errors.to_pylist()[4].startswith("undecodable Avro value (")
    first, second = rows[0], rows[1]
    assert first["at"] == AT and first["local"] == datetime(2026, 1, 2, 3, 4, 5, 6) and first["day"] == date(2026, 2, 3)
    assert first["amount"] == Decimal("-12.34") and first["times"] == [AT] and first["attrs"] == [("a", "b")]
    assert first["address"] == {"city": "Oslo", "zip": None} and second["address"] is None
    assert [r["tag"] for r in rows[:3]] == [{"member0": 7, "member1": None, "member2": None},
                                             {"member0": None, "member1": "seven", "member2": None},
                                             {"member0": None, "member1": None, "member2": True}]
    assert first["billing"] == {"city": "Lima", "zip": "15001"}


def test_every_byte_must_belong_to_the_record():
    [_, errors, _] = AvroColumn(ORDER, None).decode([_bytes(ORDER, _order(0)) + b"\x00"])
    assert "1 byte(s) after the record" in errors.to_pylist()[0]


@pytest.mark.parametrize(("schema", "problem"), [
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}, "contains itself"),
    ({"type": "record", "name": "R", "fields": [{"name": "m", "type": {"type": "map", "values": {
        "type": "long", "logicalType": "timestamp-millis"}}}]}, "a map of values with logical types"),
    ({"type": "record", "name": "R", "fields": [{"name": "d", "type": {
        "type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}}]}, "over 38"),
    ({"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}, "nope"),
    ("string", "must be an Avro record schema"),
    ("{not json", "not JSON"),
])
def test_views_spark_cannot_hold_are_refused_naming_why(schema, problem):
    with pytest.raises(SchemaProblem, match=problem):
        load_schema(schema)


def test_a_named_type_may_be_referenced_by_its_full_name():
    view = {"type": "record", "name": "Trip", "namespace": "travel", "fields": [
        {"name": "start", "type": {"type": "record", "name": "Stop", "fields": [{"name": "city", "type": "string"}]}},
        {"name": "end", "type": "travel.Stop"}, {"name": "via", "type": ["null", "Stop"], "default": None}]}
    assert ReaderView(load_schema(view)).fields == {"start": "struct<`city`:string>", "end": "struct<`city`:string>",
                                                    "via": "struct<`city`:string>"}


def test_a_key_may_be_any_type():
    assert load_schema('"string"', record=False) == "string"
    column = AvroColumn({"type": "long"}, None, "key")
    [keys, errors, _] = column.decode([_bytes("long", 42), None])
    assert keys.to_pylist() == [42, None] and errors.to_pylist() == [None, None]
    assert [name for name, _, _ in column.columns()] == ["_key_decoded", "_key_decode_error", "_key_schema_id"]


# Reading records of an older (or newer) writer schema as the view: whatever the path, what fastavro's
# schema resolution gives. The registry is a stub here (tests/integration/test_avro.py has the real one).
VIEW = {"type": "record", "name": "PageView", "namespace": "site", "fields": [
    {"name": "page", "type": "string"}, {"name": "duration_ms", "type": "long"},
    {"name": "country", "type": "string", "default": "unknown"},
    {"name": "referrer", "type": ["null", "string"], "default": None},
    {"name": "bot", "type": "boolean", "default": True},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
]}
ADDED = {**VIEW, "fields": VIEW["fields"][:2] + [{"name": "tags", "type": {"type": "array", "items": "string"}}]}
DROPPED = {**VIEW, "fields": [*VIEW["fields"], {"name": "session", "type": "string"}]}
PROMOTED = {**ADDED, "fields": [ADDED["fields"][0], {"name": "duration_ms", "type": "int"}, ADDED["fields"][2]]}
RENAMED = {**VIEW, "fields": [{"name": "path", "type": "string", "aliases": ["page"], "default": "?"}, *VIEW["fields"][1:]]}
# The same reference to a named type in both, each schema defining it otherwise (in a field the other lacks).
CITY = {"type": "record", "name": "Place", "fields": [{"name": "city", "type": "string"}]}
PLACED = {**ADDED, "fields": [*ADDED["fields"][:2], {"name": "work", "type": CITY}, {"name": "home", "type": "site.Place"}]}
PLACES = {**VIEW, "fields": [*VIEW["fields"][:4], {"name": "shop", "type": ["null", {**CITY, "fields": [
    *CITY["fields"], {"name": "zip", "type": "string", "default": "0000"}]}], "default": None},
    {"name": "home", "type": "site.Place"}]}


def _record(schema: dict, i: int) -> dict:
    values = {"page": f"/p/{i}", "path": f"/p/{i}", "duration_ms": i * 7, "country": "NO", "referrer": None,
              "bot": False, "tags": ["a"] * (i % 3), "session": f"s{i}", "work": {"city": "Oslo"},
              "home": {"city": "Lima"}}
    return {f["name"]: values[f["name"]] for f in schema["fields"]}


def _column(view: dict, writers: dict[int, dict], monkeypatch) -> AvroColumn:
    from kafka_batch.formats import registry

    monkeypatch.setattr(registry, "fetch", lambda _config, ident, _kind, parse: parse(json.dumps(writers[ident]), {}))
    return AvroColumn(view, {"url": "http://registry.invalid"})


@pytest.mark.parametrize(("writer", "view"), [
    (ADDED, VIEW), (DROPPED, VIEW), (VIEW, VIEW), (PROMOTED, VIEW), (ADDED, RENAMED), (PLACED, PLACES),
], ids=["fields-added-with-defaults", "a-field-dropped", "the-view-itself", "int-promoted-to-long",
        "renamed-with-an-alias", "a-named-record-defined-otherwise"])
def test_a_record_of_another_writer_schema_reads_as_fastavros_resolution_gives_it(writer, view, monkeypatch):
    column = _column(view, {7: writer}, monkeypatch)
    datums = [_bytes(writer, _record(writer, i)) for i in range(5)]
    decoded, errors, ids = column.decode([b"\x00" + (7).to_bytes(4, "big") + datum for datum in datums])
    resolved = [schemaless_reader(io.BytesIO(datum), parse_schema(writer), parse_schema(view)) for datum in datums]
    assert errors.to_pylist() == [None] * 5 and ids.to_pylist() == [7] * 5
    assert decoded.to_pylist() == column.view.records_to_arrow(resolved).to_pylist()


def test_a_writer_that_only_lacks_defaulted_fields_is_read_as_written_not_resolved_record_by_record(monkeypatch):
    from kafka_batch.formats import avro

    resolved = []

    def reader(buffer, writer, view):
        resolved.append(view is not None)
        return schemaless_reader(buffer, writer, view)

    monkeypatch.setattr(avro, "schemaless_reader", reader)
    column = _column(VIEW, {1: ADDED, 2: PROMOTED}, monkeypatch)
    column.decode([b"\x00" + (1).to_bytes(4, "big") + _bytes(ADDED, _record(ADDED, i)) for i in range(3)])
    assert resolved == [False] * 3
    column.decode([b"\x00" + (2).to_bytes(4, "big") + _bytes(PROMOTED, _record(PROMOTED, 1))])
    assert resolved[3:] == [True]  # a promotion is fastavro's to resolve


@pytest.mark.parametrize(("writer", "problem"), [
    ({**VIEW, "fields": VIEW["fields"][1:]}, "No default value for field page"),
    ({**ADDED, "name": "Visit"}, "Visit"),
])
def test_a_writer_the_view_cannot_read_makes_the_record_invalid_naming_why(writer, problem, monkeypatch):
    column = _column(VIEW, {3: writer}, monkeypatch)
    [decoded, errors, _] = column.decode([b"\x00" + (3).to_bytes(4, "big") + _bytes(writer, _record(writer, 1))])
    assert decoded.to_pylist() == [None]
    assert "schema id 3 cannot be read as the pipeline's schema" in errors.to_pylist()[0]
    assert problem in errors.to_pylist()[0]
