"""Sample page views for the demo, the benchmark and the tests (deterministic for a seed)."""

from __future__ import annotations

import json
import random
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

PAGES = ["/", "/search", "/cart", "/checkout", "/product/1", "/product/2", "/product/3", "/help"]


def ensure_topic(config: dict[str, Any], topic: str, partitions: int) -> None:
    admin = AdminClient({k: v for k, v in config.items() if k == "bootstrap.servers" or k.startswith(("security.", "sasl.", "ssl."))})
    if topic in admin.list_topics(timeout=30).topics:
        return
    futures = admin.create_topics([NewTopic(topic, partitions, 1)])
    for future in futures.values():
        future.result()


def page_view(rng: random.Random) -> tuple[str, dict]:
    user = f"user-{rng.randrange(1000)}"
    return user, {"user_id": user, "page": rng.choice(PAGES), "duration_ms": rng.randrange(10, 60_000)}


def produce_page_views(
    config: dict[str, Any], topic: str, count: int, seed: int = 0, start_ms: int | None = None, spacing_ms: int = 50
) -> None:
    """Produce `count` JSON page views keyed by user, idempotently; timestamps spaced by spacing_ms."""
    rng = random.Random(seed)
    producer = Producer({
        "bootstrap.servers": config["bootstrap.servers"],
        **{k: v for k, v in config.items() if k.startswith(("security.", "sasl.", "ssl."))},
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.num.messages": 10_000,
    })
    for i in range(count):
        key, value = page_view(rng)
        timestamp = None if start_ms is None else start_ms + i * spacing_ms
        while True:
            try:
                if timestamp is None:
                    producer.produce(topic, key=key, value=json.dumps(value))
                else:
                    producer.produce(topic, key=key, value=json.dumps(value), timestamp=timestamp)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} records to {topic} were not delivered")
