"""The Protobuf reader view (kafka_batch.formats.protobuf): types, presence, the Confluent message
indexes, what it refuses. Pure logic; messages are built with the view's own classes and compared with
what was set."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from google.protobuf import descriptor_pb2

from kafka_batch.formats.protobuf import (
    ProtobufColumn,
    ProtoProblem,
    ProtoView,
    compile_proto,
    first_message,
    message_indexes,
    writer_messages,
)

PROTO = '''syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Order {
  int64 id = 1; string customer = 2; google.protobuf.Timestamp at = 3; optional string note = 4;
  Address address = 5; repeated string tags = 6; map<string, int32> counts = 7; Status status = 8;
  oneof pay { string card = 9; int64 cash = 10; } uint64 big = 11; google.protobuf.Int64Value maybe = 12;
  repeated Address others = 13;
  message Line { string sku = 1; }
}
message Address { string city = 1; }
enum Status { NEW = 0; DONE = 1; }
'''


@pytest.fixture(scope="module")
def view() -> ProtoView:
    return ProtoView(compile_proto(PROTO), "shop.Order")


def test_types_follow_sparks_protobuf_mapping(view):
    assert view.fields == {
        "id": "bigint", "customer": "string", "at": "timestamp", "note": "string",
        "address": "struct<`city`:string>", "tags": "array<string>", "counts": "map<string,int>",
        "status": "string", "card": "string", "cash": "bigint", "big": "decimal(20,0)", "maybe": "bigint",
        "others": "array<struct<`city`:string>>",
    }
    assert first_message(compile_proto(PROTO)) == "shop.Order"


def test_plain_messages_decode_with_presence_and_defaults(view):
    cls = type(view.parse(b""))
    full = cls(id=7, customer="ada", note="n", tags=["a"], counts={"k": 2}, status=1, cash=3, big=2**64 - 1)
    full.at.FromMilliseconds(1_700_000_000_123)
    full.address.city = "Oslo"
    full.maybe.value = 5
    full.others.add(city="Lima")
    column = ProtobufColumn(compile_proto(PROTO), "shop.Order", None)
    decoded, errors, _ = column.decode([full.SerializeToString(), cls().SerializeToString(), None, b"\xff\xff"])
    first, empty, none, bad = decoded.to_pylist()
    assert first == {"id": 7, "customer": "ada", "at": datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
                     "note": "n", "address": {"city": "Oslo"}, "tags": ["a"], "counts": [("k", 2)],
                     "status": "DONE", "card": None, "cash": 3, "big": Decimal(2**64 - 1), "maybe": 5,
                     "others": [{"city": "Lima"}]}
    # Unset: scalars without presence read as their defaults, the rest null.
    assert empty == {"id": 0, "customer": "", "at": None, "note": None, "address": None, "tags": [], "counts": [],
                     "status": "NEW", "card": None, "cash": None, "big": Decimal(0), "maybe": None, "others": []}
    assert none is None and bad is None
    assert errors.to_pylist()[:3] == [None] * 3 and "undecodable Protobuf payload" in errors.to_pylist()[3]


def test_message_indexes_of_the_confluent_wire_format():
    assert message_indexes(b"\x00rest", 0) == ([0], 1)
    assert message_indexes(b"\x04\x02\x04rest", 0) == ([1, 2], 3)  # zigzag: count 2, indexes 1 and 2
    with pytest.raises(ValueError, match="cut short"):
        message_indexes(b"\x04\x02", 0)


def test_writer_messages_name_each_index_path():
    file = descriptor_pb2.FileDescriptorSet.FromString(compile_proto(PROTO)).file[-1]
    names = writer_messages(base64.standard_b64encode(file.SerializeToString()).decode(), {})
    # Nested types count as the file holds them, map entries included (as Confluent's serializers count).
    assert names == {(0,): "shop.Order", (0, 0): "shop.Order.CountsEntry", (0, 1): "shop.Order.Line",
                     (1,): "shop.Address"}


@pytest.mark.parametrize(("text", "problem"), [
    ('syntax = "proto3"; message X { int64 = 1; }', "Expected field name"),
    ('syntax = "proto3"; message Node { Node next = 1; }', "contains itself"),
])
def test_views_that_do_not_compile_or_map_are_refused(text, problem):
    with pytest.raises(ProtoProblem, match=problem):
        ProtoView(compile_proto(text), first_message(compile_proto(text)))


def test_a_compile_that_outlasts_its_bound_is_refused_saying_so(monkeypatch):
    from kafka_batch.formats import protobuf

    monkeypatch.setattr(protobuf, "PROTOC_TIMEOUT_S", 0.01)  # shorter than the child's start
    with pytest.raises(ProtoProblem, match=r"protoc did not compile the view within 0.01 s"):
        compile_proto('syntax = "proto3"; message A { string x = 1; }')
