"""Avro records through a Schema Registry (the Confluent wire format) and plain Avro, against the topic
decoded independently: schema versions interleaved across partitions, Avro keys, nested and nullable
fields, unions, logical types, poison records, a registry that is down or refuses the credentials, and
a replay after a schema change.

The ground truth is the topic read with a plain read_committed consumer and decoded in this process by
confluent-kafka's AvroDeserializer (with the same reader schema), never by the pipeline's code.
"""

from __future__ import annotations

import json
import os
import random
import struct
import threading
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_batch.config import load_pipeline
from kafka_batch_dev.schema_registry import serve
from tests.integration.helpers import (
    committed_records,
    create_topic,
    kafka_config,
    pg_connect,
    positions,
    query,
    run_cli,
)

pytestmark = pytest.mark.integration

ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": None}]}
AMOUNT = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
AT = {"type": "long", "logicalType": "timestamp-millis"}
# Three writer versions, and the pipeline's reader view: v1 lacks tag, day and channel (their defaults
# apply), v3 dropped the address (null, its default) and added a note the view does not have.
V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"}, {"name": "at", "type": AT},
    {"name": "amount", "type": AMOUNT}, {"name": "address", "type": ["null", ADDRESS], "default": None}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "tag", "type": ["null", "int", "string"], "default": None},
                       {"name": "day", "type": {"type": "int", "logicalType": "date"}, "default": 0}]}
V3 = {**V1, "fields": [f for f in V2["fields"] if f["name"] != "address"] + [
    {"name": "channel", "type": {"type": "enum", "name": "Channel", "symbols": ["WEB", "SHOP"]}, "default": "WEB"},
    {"name": "note", "type": "string", "default": ""}]}
VIEW = {**V1, "fields": [*V2["fields"], V3["fields"][-2]]}  # everything but the note
KEY = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
COLUMNS = {
    "order_id": {"expr": "record_key.id", "type": "bigint"}, "customer": "customer",
    "at": {"expr": "at", "type": "timestamptz"}, "amount": "CAST(amount AS STRING)",
    "city": "address.city", "zip": "address.zip",
    "tag": "coalesce(CAST(tag.member0 AS STRING), tag.member1)", "day": {"expr": "day", "type": "date"},
    "channel": "channel",
}


def registry_url() -> str:
    conn = json.loads(os.environ["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    credentials = f"{conn['login']}:{conn.get('password', '')}@" if conn.get("login") else ""
    return f"{conn.get('schema', 'http')}://{credentials}{conn['host']}:{conn['port']}"


def registry_client(url: str | None = None) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url or registry_url()})


def avro_pipeline(prefix: str, partitions: int = 3, schema: dict = VIEW, key: dict | None = KEY,
                  columns: dict = COLUMNS, framing: str = "confluent", **more):
    """An Avro pipeline with one rows sink (each record's decoded fields) on a new topic."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    record = {"format": "avro", "framing": framing, "schema": schema}
    if key is not None:
        record["key"] = {"schema": key, "framing": framing}
    definition = {
        "name": name, "topics": [f"{name}_topic"], "schedule": None,
        "connections": {"spark": os.environ["KAFKA_BATCH_TEST_SPARK_CONN"], **more.pop("connections", {})},
        "record": record, "sinks": {"rows": {"table": name, "columns": columns}}, **more,
    }
    (Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    create_topic(f"{name}_topic", partitions)
    return load_pipeline(name)


def order(rng: random.Random, i: int, version: int) -> dict:
    value = {"id": i, "customer": rng.choice(["ada", "alan", "grace"]),
             "at": datetime.fromtimestamp(1_767_225_600 + i * 7 + rng.randrange(1000) / 1000, UTC),
             "amount": Decimal(rng.randrange(-100_000, 100_000)) / 100}
    if version < 3:
        value["address"] = rng.choice([None, {"city": rng.choice(["Oslo", "Lima"]), "zip": rng.choice([None, "0150"])}])
    if version > 1:
        value["tag"] = rng.choice([None, rng.randrange(100), rng.choice(["a", "b"])])
        value["day"] = date(2026, 1, 1 + rng.randrange(28))
    if version == 3:
        value["channel"] = rng.choice(["WEB", "SHOP"])
        value["note"] = "n" * rng.randrange(3)
    return value


def produce_orders(topic: str, count: int, url: str | None = None, seed: int = 0, first: int = 0,
                   versions: tuple[int, ...] = (1, 2, 3)) -> None:
    """`count` orders (ids from `first`), each written with a version drawn at random, keyed by an Avro
    OrderKey, to random partitions (so every partition interleaves the versions)."""
    client = registry_client(url)
    values = {v: AvroSerializer(client, json.dumps(schema)) for v, schema in ((1, V1), (2, V2), (3, V3))}
    keys = AvroSerializer(client, json.dumps(KEY))
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "enable.idempotence": True})
    partitions = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    for i in range(first, first + count):
        version = rng.choice(versions)
        producer.produce(topic, partition=rng.randrange(partitions),
                         key=keys({"id": i}, SerializationContext(topic, MessageField.KEY)),
                         value=values[version](order(rng, i, version), SerializationContext(topic, MessageField.VALUE)))
        producer.poll(0)
    assert producer.flush(30) == 0


def truth(topic: str, url: str | None = None, view: dict = VIEW, skip=()) -> dict[tuple, tuple]:
    """(topic, partition, offset) -> the rows sink's columns, from the topic decoded here with
    confluent-kafka's AvroDeserializer reading as `view`."""
    client = registry_client(url)
    values = AvroDeserializer(client, json.dumps(view))
    keys = AvroDeserializer(client, json.dumps(KEY))
    rows = {}
    for partition, offset, key, value, _ in committed_records(topic):
        if (partition, offset) in skip:
            continue
        record = values(value, SerializationContext(topic, MessageField.VALUE))
        address, tag = record["address"] or {}, record["tag"]
        rows[(topic, partition, offset)] = (
            keys(key, SerializationContext(topic, MessageField.KEY))["id"], record["customer"], record["at"],
            str(record["amount"]), address.get("city"), address.get("zip"), None if tag is None else str(tag),
            date(1970, 1, 1) if record["day"] == 0 else record["day"], record.get("channel"))
    return rows


def contents(pipeline, columns: dict = COLUMNS) -> dict[tuple, tuple]:
    """The rows sink's `columns` per (topic, partition, offset)."""
    rows = query(f"SELECT kafka_topic, kafka_partition, kafka_offset, {', '.join(columns)} FROM {pipeline.name}")
    return {tuple(r[:3]): tuple(r[3:]) for r in rows}


def writer_ids(topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> the schema id in each record's Confluent header, read from the raw bytes."""
    return {(partition, offset): struct.unpack(">I", value[1:5])[0]
            for partition, offset, _, value, _ in committed_records(topic)}


def versions_per_partition(topic: str) -> list[int]:
    """How many writer schemas each partition holds."""
    found: dict[int, set[int]] = {}
    for (partition, _), ident in writer_ids(topic).items():
        found.setdefault(partition, set()).add(ident)
    return [len(ids) for _, ids in sorted(found.items())]


def test_interleaved_schema_versions_nested_unions_logical_types_and_keys_match_the_topic(services):
    pipeline = avro_pipeline("avro_versions", limits={"max_records_per_task": 150})
    topic = pipeline.topics[0]
    produce_orders(topic, 700, seed=1)
    run_cli("run", "--pipeline", pipeline.name)
    produce_orders(topic, 300, seed=2, first=700)
    run_cli("run", "--pipeline", pipeline.name)
    assert query("SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %s", pipeline.name) == [(0,)]
    expected = truth(topic)
    assert len(expected) == 1000
    got = contents(pipeline)
    assert got == expected
    # Every partition interleaves the three writer schemas, and every field kind is exercised.
    assert versions_per_partition(topic) == [3, 3, 3]
    assert len({v[0] for v in expected.values()}) == 1000  # every key decoded, each once
    # The ledger says which schemas wrote each committed range, as the topic holds them.
    held = writer_ids(topic)
    ledger = query("SELECT partition, from_offset, until_offset, schema_ids FROM kafka_batch.ledger"
                   " WHERE pipeline = %s", pipeline.name)
    assert len(ledger) == 6
    for partition, lo, hi, schema_ids in ledger:
        assert schema_ids == sorted({held[(partition, o)] for o in range(lo, hi)})
    assert {row[6] for row in got.values()} >= {None, "a", "b"} and any(r[6] and r[6].isdigit() for r in got.values())
    assert {row[4] for row in got.values()} == {None, "Oslo", "Lima"} and {row[8] for row in got.values()} == {
        "WEB", "SHOP"}


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def test_poison_records_are_quarantined_with_their_reason_and_the_rest_committed(services):
    pipeline = avro_pipeline("avro_poison", partitions=1, limits={"max_invalid_ratio": 0.5})
    topic = pipeline.topics[0]
    produce_orders(topic, 20, seed=3)
    client = registry_client()
    good = AvroSerializer(client, json.dumps(V2))(order(random.Random(9), 99, 2),
                                                  SerializationContext(topic, MessageField.VALUE))
    key = AvroSerializer(client, json.dumps(KEY))({"id": 99}, SerializationContext(topic, MessageField.KEY))
    poison = {
        b'{"id": 1}': "not in the Confluent wire format: first byte 0x7b",
        b"\x00\x01": "not in the Confluent wire format: 2 byte(s)",
        _framed(987_654, good[5:]): "schema id 987654 is unknown to the registry",
        good[:-3]: "undecodable Avro payload",
        good + b"\x02junk": "byte(s) after the record",
    }
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    for value in poison:
        producer.produce(topic, key=key, value=value)
    producer.produce(topic, key=b"plain text key", value=good)  # a key that is not Avro
    assert producer.flush(10) == 0
    produce_orders(topic, 10, seed=4)
    result = run_cli("run", "--pipeline", pipeline.name)
    assert "6 quarantined" in result.stdout
    reasons = query('SELECT "offset", reason FROM kafka_batch.quarantine WHERE pipeline = %s ORDER BY "offset"',
                    pipeline.name)
    assert [o for o, _ in reasons] == list(range(20, 26))
    for (_, reason), expected in zip(reasons, [*poison.values(), "key not in the Confluent wire format"], strict=True):
        assert expected in reason, (reason, expected)
    bad = {(0, o) for o in range(20, 26)}
    assert contents(pipeline) == truth(topic, skip=bad)  # the 30 good records, each once
    assert positions(pipeline.name) == {(topic, 0): 36}


def test_plain_avro_with_a_fixed_schema(services):
    import io

    from fastavro import parse_schema, schemaless_writer

    pipeline = avro_pipeline("avro_plain", partitions=2, schema=V1, key=None, framing="none",
                             columns={"customer": "customer", "amount": "CAST(amount AS STRING)", "city": "address.city"})
    topic = pipeline.topics[0]
    rng = random.Random(5)
    written, parsed = [], parse_schema(V1)
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    for i in range(50):
        value = order(rng, i, 1)
        buffer = io.BytesIO()
        schemaless_writer(buffer, parsed, value)
        producer.produce(topic, partition=i % 2, value=buffer.getvalue())
        written.append((i % 2, value))
    assert producer.flush(10) == 0
    run_cli("run", "--pipeline", pipeline.name)
    offsets = {0: 0, 1: 0}
    expected = {}
    for partition, value in written:
        expected[(topic, partition, offsets[partition])] = (
            value["customer"], f"{value['amount']:.2f}", (value["address"] or {}).get("city"))
        offsets[partition] += 1
    rows = query(f"SELECT kafka_topic, kafka_partition, kafka_offset, customer, amount, city FROM {pipeline.name}")
    assert {tuple(r[:3]): tuple(r[3:]) for r in rows} == expected


class LocalRegistry:
    """A registry of the test's own (kafka_batch_dev.schema_registry) that it can stop and start again on
    the same address and schemas, optionally with basic auth. Each gets a loopback address of its own:
    workers keep schemas by registry URL and id (ids never change within a registry), so a later test's
    registry on a reused port must not look like this one."""

    def __init__(self, data: Path, credentials: str | None = None):
        self.data, self.credentials, self.port = data, credentials, 0
        self.host = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
        self.server = None
        self.start()

    def start(self) -> None:
        self.server = serve(self.port, self.data, self.credentials, host=self.host)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, credentials: str | None = None) -> str:
        return f"http://{credentials + '@' if credentials else ''}{self.host}:{self.port}"


def _connection(conn_id: str, url: str) -> dict[str, str]:
    from kafka_batch_dev.local_stack import schema_registry_connection

    return {f"AIRFLOW_CONN_{conn_id.upper()}": schema_registry_connection(url)}


def test_a_registry_that_is_down_fails_the_batch_and_the_retry_commits_once(services, tmp_path):
    registry = LocalRegistry(tmp_path / "registry")
    conn_id = f"registry_{uuid.uuid4().hex[:6]}"
    pipeline = avro_pipeline("avro_down", connections={"schema_registry": conn_id})
    topic = pipeline.topics[0]
    produce_orders(topic, 200, url=registry.url(), seed=6)
    env = _connection(conn_id, registry.url())
    run_cli("validate", "--pipeline", pipeline.name, env=env)  # analyzed: the batch's own read meets the outage
    registry.stop()
    failed = run_cli("run", "--pipeline", pipeline.name, check=False, env=env)
    assert failed.returncode == 4, failed.stderr
    assert "schema registry" in failed.stderr and "did not answer" in failed.stderr
    assert query(f"SELECT count(*) FROM {pipeline.name}") == [(0,)]
    assert not positions(pipeline.name) or set(positions(pipeline.name).values()) == {0}
    registry.start()  # same port and schemas
    run_cli("run", "--pipeline", pipeline.name, env=env)
    assert contents(pipeline) == truth(topic, url=registry.url())
    registry.stop()


def test_wrong_registry_credentials_are_one_line_exit_2_and_nothing_is_committed(services, tmp_path):
    registry = LocalRegistry(tmp_path / "registry", credentials="reader:right")
    conn_id = f"registry_{uuid.uuid4().hex[:6]}"
    pipeline = avro_pipeline("avro_auth", connections={"schema_registry": conn_id})
    topic = pipeline.topics[0]
    produce_orders(topic, 50, url=registry.url("reader:right"), seed=7)
    run_cli("validate", "--pipeline", pipeline.name, env=_connection(conn_id, registry.url("reader:right")))
    failed = run_cli("run", "--pipeline", pipeline.name, check=False,
                     env=_connection(conn_id, registry.url("reader:wrong")))
    assert failed.returncode == 2, failed.stderr
    line = [line for line in failed.stderr.splitlines() if line.startswith("kafka-batch:")]
    assert len(line) == 1 and "refused the connection's credentials (HTTP 401" in line[0]
    assert "wrong" not in failed.stderr  # the password is never shown
    assert query(f"SELECT count(*) FROM {pipeline.name}") == [(0,)]
    assert query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s AND status = 'committed'",
                 pipeline.name) == [(0,)]
    run_cli("run", "--pipeline", pipeline.name, env=_connection(conn_id, registry.url("reader:right")))
    assert contents(pipeline) == truth(topic, url=registry.url("reader:right"))
    registry.stop()


def test_a_replay_after_a_schema_change_reads_with_the_new_view_and_swaps_exactly(services):
    older = {**VIEW, "fields": [f for f in VIEW["fields"] if f["name"] != "channel"]}
    columns = {k: v for k, v in COLUMNS.items() if k != "channel"}
    pipeline = avro_pipeline("avro_replay", schema=older, columns=columns)
    topic = pipeline.topics[0]
    produce_orders(topic, 300, seed=8)
    run_cli("run", "--pipeline", pipeline.name)
    rows = query(f"SELECT kafka_topic, kafka_partition, kafka_offset, {', '.join(columns)} FROM {pipeline.name}")
    assert {tuple(r[:3]): tuple(r[3:]) for r in rows} == {k: v[:-1] for k, v in truth(topic, view=older).items()}

    # The view gains `channel` (v1 and v2 records read its default); a replay of everything re-decodes.
    path = Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{pipeline.name}.yaml"
    definition = yaml.safe_load(path.read_text())
    definition["record"]["schema"] = VIEW
    # The table's columns in their order (the definition was written with sorted keys), then the new one.
    definition["sinks"]["rows"]["columns"] = {**dict(sorted(columns.items())), "channel": "channel"}
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    conn = pg_connect()
    with conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {pipeline.name} ADD COLUMN channel text")
    conn.close()
    committed = positions(pipeline.name)
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic,
            "--from-time", "2000-01-01T00:00:00Z", "--until-time", "2100-01-01T00:00:00Z")
    assert contents(pipeline) == truth(topic)
    assert positions(pipeline.name) == committed


def test_a_replay_after_a_default_changes_swaps_the_totals_exactly(services):
    """An aggregate per channel: records written before `channel` existed count under the view's
    default; the view's default changes, a replay of everything re-reads them and moves their totals."""
    aggregate = {"table": None, "group_by": {"channel": "channel"},
                 "measures": {"orders": "1", "cents": "CAST(amount * 100 AS BIGINT)"}}
    pipeline = avro_pipeline("avro_totals", key=None, columns={"customer": "customer"})
    update = yaml.safe_load((Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{pipeline.name}.yaml").read_text())
    update["sinks"] = {"aggregate": {**aggregate, "table": f"{pipeline.name}_channels"}}
    path = Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{pipeline.name}.yaml"
    path.write_text(yaml.safe_dump(update))
    topic = pipeline.topics[0]
    produce_orders(topic, 400, seed=12)

    def totals(view: dict) -> dict[str, tuple[int, int]]:
        deserialize = AvroDeserializer(registry_client(), json.dumps(view))
        found: dict[str, list[int]] = {}
        for _, _, _, value, _ in committed_records(topic):
            record = deserialize(value, SerializationContext(topic, MessageField.VALUE))
            entry = found.setdefault(record["channel"], [0, 0])
            entry[0] += 1
            entry[1] += int(record["amount"] * 100)
        return {channel: tuple(entry) for channel, entry in found.items()}

    def table() -> dict[str, tuple[int, int]]:
        return {c: (n, cents) for c, n, cents in query(f"SELECT channel, orders, cents FROM {pipeline.name}_channels")}

    run_cli("run", "--pipeline", pipeline.name)
    assert table() == totals(VIEW)
    shop_default = {**VIEW, "fields": [{**f, "default": "SHOP"} if f["name"] == "channel" else f for f in VIEW["fields"]]}
    update["record"]["schema"] = shop_default
    path.write_text(yaml.safe_dump(update))
    committed = positions(pipeline.name)
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic,
            "--from-time", "2000-01-01T00:00:00Z", "--until-time", "2100-01-01T00:00:00Z")
    assert table() == totals(shop_default) != totals(VIEW)
    assert positions(pipeline.name) == committed


# Debezium's Postgres connector with the Avro converter: the row schema inside the envelope's.
ROW = {"type": "record", "name": "Value", "namespace": "shop.public.customers", "fields": [
    {"name": "customer_id", "type": "string"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "balance", "type": ["null", "long"], "default": None}]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.customers", "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "connector", "type": "string"}, {"name": "lsn", "type": ["null", "long"],
                                                                                      "default": None}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def test_a_debezium_envelope_inside_avro_mirrors_the_source_table(services):
    """Change events as Avro (the envelope's schema around the row's), keyed by an Avro key, into the upsert
    sink ordered by the source's LSN: the mirror equals the source table the events describe."""
    name = f"avro_cdc_{uuid.uuid4().hex[:8]}"
    definition = {
        "name": name, "topics": [f"{name}_topic"], "schedule": None,
        "connections": {"spark": os.environ["KAFKA_BATCH_TEST_SPARK_CONN"]},
        "record": {"format": "avro", "schema": ENVELOPE, "envelope": "debezium",
                   "key": {"schema": {"type": "record", "name": "Key", "fields": [
                       {"name": "customer_id", "type": "string"}]}}},
        "sinks": {"upsert": {"table": name, "key": {"customer_id": "record_key.customer_id"},
                             "columns": {"name": "name", "balance": {"expr": "balance", "type": "bigint"}},
                             "version": "source.lsn"}},
    }
    (Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    topic = f"{name}_topic"
    create_topic(topic, 2)
    client = registry_client()
    values = AvroSerializer(client, json.dumps(ENVELOPE))
    keys = AvroSerializer(client, json.dumps(definition["record"]["key"]["schema"]))
    rng = random.Random(11)
    table: dict[str, dict] = {}
    events = []
    for lsn in range(1000, 1400):  # the source table changes; each change is one event
        key = f"c{rng.randrange(40):02d}"
        before = table.get(key)
        if before is not None and rng.random() < 0.2:
            op, after = "d", None
            del table[key]
        else:
            op, after = ("u" if before else "c"), {"customer_id": key, "name": rng.choice(["Ada", "Alan"]),
                                                    "balance": rng.randrange(1000)}
            table[key] = after
        events.append((key, {"before": before if op != "c" else None, "after": after,
                             "source": {"connector": "postgresql", "lsn": lsn}, "op": op, "ts_ms": lsn}))
    # Delivered out of order across the two partitions' batches: the LSN decides, not the offset.
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    for half in (events[1::2], events[0::2]):
        for key, event in half:
            producer.produce(topic, partition=hash(key) % 2,
                             key=keys({"customer_id": key}, SerializationContext(topic, MessageField.KEY)),
                             value=values(event, SerializationContext(topic, MessageField.VALUE)))
        assert producer.flush(10) == 0
        run_cli("run", "--pipeline", name)
    mirrored = {k: (n, b) for k, n, b in query(f"SELECT customer_id, name, balance FROM {name}")}
    assert mirrored == {k: (r["name"], r["balance"]) for k, r in table.items()}
    assert query("SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %s", name) == [(0,)]
