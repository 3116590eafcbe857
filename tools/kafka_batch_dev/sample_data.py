"""Sample data for the demos, the benchmark and the tests (deterministic for a seed): page views (JSON,
or Avro through a Schema Registry), customers of a keyed topic (updates and tombstones), and Debezium
change events of a customers table."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_batch_dev.committed import client_settings

PAGES = ["/", "/search", "/cart", "/checkout", "/product/1", "/product/2", "/product/3", "/help"]


def ensure_topic(config: dict[str, Any], topic: str, partitions: int, settings: dict[str, str] | None = None) -> None:
    """Create the topic (with its `settings`, e.g. cleanup.policy; replicas: the cluster's default) unless it exists."""
    admin = AdminClient(client_settings(config))
    if topic in admin.list_topics(timeout=30).topics:
        return
    futures = admin.create_topics([NewTopic(topic, partitions, config=settings or {})])
    for future in futures.values():
        future.result()
    wait_for_topic(admin, topic, partitions)


def wait_for_topic(admin: AdminClient, topic: str, partitions: int, timeout: float = 30) -> None:
    """Wait until the broker's metadata has the topic just created with all its partitions: the controller
    answers first, and a client started right after (another process) may be told it does not exist."""
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"topic {topic} is not in the broker's metadata {timeout:g} s after its creation")
        time.sleep(0.1)


def _producer(config: dict[str, Any]) -> Producer:
    return Producer({
        **client_settings(config),
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.num.messages": 10_000,
    })


def send(producer: Producer, topic: str, key: str | bytes, value: str | bytes | None, **more: Any) -> None:
    """Produce one record, waiting while the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, key=key, value=value, **more)
            break
        except BufferError:
            producer.poll(0.5)
    producer.poll(0)


def flush(producer: Producer, topic: str, timeout: float = 60) -> None:
    remaining = producer.flush(timeout)
    if remaining:
        raise RuntimeError(f"{remaining} records to {topic} were not delivered")


def page_view(rng: random.Random, users: int = 1000) -> tuple[str, dict]:
    user = f"user-{rng.randrange(users)}"
    return user, {"user_id": user, "page": rng.choice(PAGES), "duration_ms": rng.randrange(10, 60_000)}


def produce_page_views(
    config: dict[str, Any], topic: str, count: int, seed: int = 0, start_ms: int | None = None, spacing_ms: int = 50,
    users: int = 1000,
) -> None:
    """Produce `count` JSON page views of `users` users, keyed by user, idempotently; timestamps spaced by
    spacing_ms."""
    rng = random.Random(seed)
    producer = _producer(config)
    for i in range(count):
        key, value = page_view(rng, users)
        timestamp = None if start_ms is None else start_ms + i * spacing_ms
        send(producer, topic, key, json.dumps(value), **({} if timestamp is None else {"timestamp": timestamp}))
    flush(producer, topic)


# The Avro page view, version 1, and version 2 with a field added with a default (the sample's reader view).
PAGE_VIEW_V1 = {"type": "record", "name": "PageView", "namespace": "kafka_batch.sample", "fields": [
    {"name": "user_id", "type": "string"},
    {"name": "page", "type": "string"},
    {"name": "duration_ms", "type": "long"},
    {"name": "viewed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
PAGE_VIEW_V2 = {**PAGE_VIEW_V1, "fields": [*PAGE_VIEW_V1["fields"],
                                           {"name": "country", "type": "string", "default": "unknown"}]}
COUNTRIES = ["NO", "SE", "DK", "FI", "IS"]


def produce_page_views_avro(config: dict[str, Any], registry: dict[str, Any], topic: str, count: int, seed: int = 0,
                            changed_at: int | None = None, start_ms: int = 1_767_225_600_000, users: int = 1000) -> None:
    """Produce `count` Avro page views with confluent-kafka's AvroSerializer (the Confluent wire format,
    schemas registered under `<topic>-value`), keyed by user: version 1 of the schema, then from record
    `changed_at` (default: half way) version 2, which adds `country`. `viewed_at` is start_ms plus a
    second per record."""
    from datetime import UTC, datetime

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient(registry)
    versions = [AvroSerializer(client, json.dumps(schema)) for schema in (PAGE_VIEW_V1, PAGE_VIEW_V2)]
    context = SerializationContext(topic, MessageField.VALUE)
    changed_at = count // 2 if changed_at is None else changed_at
    rng = random.Random(seed)
    producer = _producer(config)
    for i in range(count):
        key, view = page_view(rng, users)
        view["viewed_at"] = datetime.fromtimestamp((start_ms + i * 1000) / 1000, UTC)
        if i >= changed_at:
            view["country"] = rng.choice(COUNTRIES)
        send(producer, topic, key, versions[i >= changed_at](view, context))
    flush(producer, topic)


NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Niklaus"]


def customer(rng: random.Random, key: str, updated_at: int) -> dict:
    return {"customer_id": key, "name": rng.choice(NAMES), "balance": rng.randrange(-1_000, 100_000),
            "updated_at": updated_at}


def produce_customers(config: dict[str, Any], topic: str, count: int, seed: int = 0, customers: int = 1_000,
                      delete_share: float = 0.1) -> None:
    """A keyed topic of customers: each record the customer's new state, keyed by its id (so a customer
    lives in one partition); `delete_share` of them tombstones (null values: the customer is gone)."""
    rng = random.Random(seed)
    producer = _producer(config)
    for i in range(count):
        key = f"c{rng.randrange(customers):05d}"
        value = None if rng.random() < delete_share else json.dumps(customer(rng, key, 1_700_000_000_000 + i))
        send(producer, topic, key, value)
    flush(producer, topic)


def produce_customer_changes(config: dict[str, Any], topic: str, count: int, table: dict[str, dict],
                             seed: int = 0, customers: int = 500, first_lsn: int = 1_000) -> None:
    """Debezium change events of a `customers` table, as its Postgres connector writes them with the JSON
    converter ({schema, payload}; a delete's `before` holds the key only, and a tombstone follows it).
    `table` is the source table's state, changed in place: what a mirror must equal afterwards."""
    rng = random.Random(seed)
    producer = _producer(config)
    lsn = max([first_lsn, *(row["_lsn"] for row in table.values())])
    for _ in range(count):
        key = f"c{rng.randrange(customers):05d}"
        lsn += rng.randrange(1, 50)
        old = table.get(key)
        if old is not None and rng.random() < 0.2:
            op, before, after = "d", {"customer_id": key}, None
            del table[key]
        else:
            op, before, after = ("u" if old else "c"), _row(old), customer(rng, key, lsn)
            table[key] = {**after, "_lsn": lsn}
        event = {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000 + lsn, "transaction": None,
                 "source": {"version": "3.0.0.Final", "connector": "postgresql", "name": "shop", "db": "shop",
                            "schema": "public", "table": "customers", "lsn": lsn, "txId": lsn // 7,
                            "ts_ms": 1_700_000_000_000 + lsn, "snapshot": "false"}}
        message_key = json.dumps({"schema": {"type": "struct", "name": "shop.public.customers.Key"},
                                  "payload": {"customer_id": key}})
        send(producer, topic, message_key, json.dumps({"schema": {"type": "struct", "name": "shop.public.customers.Envelope"},
                                                        "payload": event}))
        if op == "d":
            send(producer, topic, message_key, None)
    flush(producer, topic)


def _row(state: dict | None) -> dict | None:
    return None if state is None else {k: v for k, v in state.items() if not k.startswith("_")}
