"""Protobuf records in the Confluent wire format through a Schema Registry, against the topic decoded
independently: three versions of the message interleaved across partitions (fields added, one removed),
nested messages, repeated fields, maps, enums, timestamps, optional fields, and poison records (a
message index naming another message, an unknown schema id, a cut payload).

The ground truth is the topic read with a plain read_committed consumer and decoded in this process by
confluent-kafka's ProtobufDeserializer with message classes protoc (grpcio-tools) builds here.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

from kafka_batch.config import load_pipeline
from tests.integration.helpers import committed_records, create_topic, kafka_config, positions, query, run_cli
from tests.integration.test_avro import contents, registry_client, versions_per_partition

pytestmark = pytest.mark.integration

HEAD = 'syntax = "proto3";\npackage shop;\nimport "google/protobuf/timestamp.proto";\n'
ADDRESS = "message Address { string city = 1; optional string zip = 2; }\n"
V1 = HEAD + ("message Order { int64 id = 1; string customer = 2; google.protobuf.Timestamp at = 3;"
             " Address address = 4; string legacy = 5; }\n") + ADDRESS
V2 = HEAD + ("message Order { int64 id = 1; string customer = 2; google.protobuf.Timestamp at = 3;"
             " Address address = 4; string legacy = 5; repeated string tags = 6; Status status = 7; }\n"
             "enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }\n") + ADDRESS
# v3 dropped `legacy` (its number reserved) and added a map and an optional amount.
V3 = HEAD + ("message Order { reserved 5; int64 id = 1; string customer = 2; google.protobuf.Timestamp at = 3;"
             " Address address = 4; repeated string tags = 6; Status status = 7; map<string, int64> counts = 8;"
             " optional int64 cents = 9; }\nenum Status { NEW = 0; PAID = 1; SHIPPED = 2; }\n") + ADDRESS
VIEW = V3
KEY = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { int64 id = 1; }\n'
COLUMNS = {"order_id": {"expr": "id", "type": "bigint"}, "key_id": {"expr": "record_key.id", "type": "bigint"},
           "customer": "customer",
           "at": {"expr": "at", "type": "timestamptz"}, "city": "address.city", "zip": "address.zip",
           "tags": "array_join(tags, ',')", "status": "status", "counts": "CAST(counts['a'] AS STRING)",
           "cents": {"expr": "cents", "type": "bigint"}}


def message_class(text: str, name: str = "shop.Order"):
    """protoc (grpcio-tools) run here, apart from the pipeline's code."""
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "order.proto").write_text(text)
        out = Path(directory) / "set.pb"
        include = Path(__import__("grpc_tools").__file__).parent / "_proto"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{directory}", f"-I{include}",
                        f"--descriptor_set_out={out}", "--include_imports", "order.proto"], check=True, timeout=120)
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName(name))


def protobuf_pipeline(prefix: str, partitions: int = 3, **more):
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    definition = {
        "name": name, "topics": [f"{name}_topic"], "schedule": None,
        "connections": {"spark": os.environ["KAFKA_BATCH_TEST_SPARK_CONN"]},
        "record": {"format": "protobuf", "schema": VIEW, "message": "shop.Order",
                   "key": {"format": "protobuf", "schema": KEY}},
        "sinks": {"rows": {"table": name, "columns": COLUMNS}}, **more,
    }
    (Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    create_topic(f"{name}_topic", partitions)
    return load_pipeline(name)


def order(cls, rng: random.Random, i: int, version: int):
    message = cls(id=i, customer=rng.choice(["ada", "alan", "grace"]))
    if rng.random() < 0.8:
        message.at.FromMilliseconds(1_767_225_600_000 + i * 1000 + rng.randrange(1000))
    if rng.random() < 0.7:
        message.address.city = rng.choice(["Oslo", "Lima"])
        if rng.random() < 0.5:
            message.address.zip = "0150"
    if version == 1 or (version == 2 and rng.random() < 0.5):
        message.legacy = "old"
    if version >= 2:
        message.tags.extend(rng.sample(["x", "y", "z"], rng.randrange(3)))
        message.status = rng.randrange(3)
    if version == 3:
        message.counts.update({"a": rng.randrange(10)} if rng.random() < 0.6 else {})
        if rng.random() < 0.5:
            message.cents = rng.randrange(-10_000, 10_000)
    return message


def produce_orders(topic: str, count: int, seed: int = 0) -> None:
    client = registry_client()
    classes = {v: message_class(text) for v, text in ((1, V1), (2, V2), (3, V3))}
    serializers = {v: ProtobufSerializer(cls, client, {"use.deprecated.format": False}) for v, cls in classes.items()}
    key_class = message_class(KEY, "shop.OrderKey")
    keys = ProtobufSerializer(key_class, client, {"use.deprecated.format": False})
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "enable.idempotence": True})
    partitions = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    context = SerializationContext(topic, MessageField.VALUE)
    for i in range(count):
        version = rng.choice((1, 2, 3))
        producer.produce(topic, partition=rng.randrange(partitions),
                         key=keys(key_class(id=i), SerializationContext(topic, MessageField.KEY)),
                         value=serializers[version](order(classes[version], rng, i, version), context))
        producer.poll(0)
    assert producer.flush(30) == 0


def truth(topic: str, skip=()) -> dict[tuple, tuple]:
    """The rows sink's columns per (topic, partition, offset), from the topic decoded here as the view."""
    deserialize = ProtobufDeserializer(message_class(VIEW), {"use.deprecated.format": False})
    key_of = ProtobufDeserializer(message_class(KEY, "shop.OrderKey"), {"use.deprecated.format": False})
    statuses = {0: "NEW", 1: "PAID", 2: "SHIPPED"}
    rows = {}
    for partition, offset, key, value, _ in committed_records(topic):
        if (partition, offset) in skip:
            continue
        m = deserialize(value, SerializationContext(topic, MessageField.VALUE))
        at = (datetime.fromtimestamp(m.at.seconds, UTC).replace(microsecond=m.at.nanos // 1000)
              if m.HasField("at") else None)
        address = m.address if m.HasField("address") else None
        rows[(topic, partition, offset)] = (
            m.id, key_of(key, SerializationContext(topic, MessageField.KEY)).id if key else None, m.customer, at, address.city if address else None,
            address.zip if address and address.HasField("zip") else None, ",".join(m.tags), statuses[m.status],
            str(m.counts["a"]) if "a" in m.counts else None, m.cents if m.HasField("cents") else None)
    return rows


def test_interleaved_message_versions_match_the_topic_decoded_independently(services):
    pipeline = protobuf_pipeline("proto_versions", limits={"max_records_per_task": 200})
    topic = pipeline.topics[0]
    produce_orders(topic, 600, seed=1)
    run_cli("run", "--pipeline", pipeline.name)
    assert query("SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %s", pipeline.name) == [(0,)]
    expected = truth(topic)
    assert len(expected) == 600 and contents(pipeline, COLUMNS) == expected
    assert versions_per_partition(topic) == [3, 3, 3]  # every partition interleaves the versions


def test_protobuf_poison_records_are_quarantined_with_their_reason(services):
    pipeline = protobuf_pipeline("proto_poison", partitions=1, limits={"max_invalid_ratio": 0.5})
    topic = pipeline.topics[0]
    produce_orders(topic, 10, seed=2)
    client = registry_client()
    context = SerializationContext(topic, MessageField.VALUE)
    orders, addresses = message_class(VIEW), message_class(VIEW, "shop.Address")
    good = ProtobufSerializer(orders, client, {"use.deprecated.format": False})(
        order(orders, random.Random(3), 99, 3), context)
    other = ProtobufSerializer(addresses, client, {"use.deprecated.format": False})(addresses(city="Oslo"), context)
    poison = {
        other: "is shop.Address; the pipeline reads shop.Order",
        b"\x00" + struct.pack(">I", 987_654) + good[5:]: "schema id 987654 is unknown to the registry",
        good[:-3]: "undecodable Protobuf payload",
        b'{"id": 1}': "not in the Confluent wire format",
    }
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    for value in poison:
        producer.produce(topic, value=value)
    assert producer.flush(10) == 0
    produce_orders(topic, 5, seed=4)
    run_cli("run", "--pipeline", pipeline.name)
    reasons = query('SELECT "offset", reason FROM kafka_batch.quarantine WHERE pipeline = %s ORDER BY "offset"',
                    pipeline.name)
    assert [o for o, _ in reasons] == list(range(10, 14))
    for (_, reason), expected in zip(reasons, poison.values(), strict=True):
        assert expected in reason, (reason, expected)
    assert contents(pipeline, COLUMNS) == truth(topic, skip={(0, o) for o in range(10, 14)})
    assert positions(pipeline.name) == {(topic, 0): 19}
