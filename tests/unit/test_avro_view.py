"""The Avro reader view (kafka_batch.formats.avro): Spark and Arrow types, decoding, what it refuses.
Pure logic; the records are written with fastavro here and compared with what was written."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from fastavro import parse_schema, schemaless_writer

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


def test_a_key_may_be_any_type():
    assert load_schema('"string"', record=False) == "string"
    column = AvroColumn({"type": "long"}, None, "key")
    [keys, errors, _] = column.decode([_bytes("long", 42), None])
    assert keys.to_pylist() == [42, None] and errors.to_pylist() == [None, None]
    assert [name for name, _, _ in column.columns()] == ["_key_decoded", "_key_decode_error", "_key_schema_id"]
