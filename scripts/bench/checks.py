"""What a result is compared against, read from the topics themselves, never through the pipeline: a
topic's committed messages, and its ground-truth aggregate."""

from __future__ import annotations

import json
from collections import Counter

from confluent_kafka import TopicPartition

from bench.env import Env
from bench.peers import plain_consumer
from kafka_batch.core import database
from kafka_batch.kafka.source import KafkaOffsets


def published(env: Env, topic: str, headers: bool = False) -> Counter:
    """Every committed message of `topic` as (key, value parsed, and its headers if `headers`), counted:
    two topics hold the same messages when these are equal, whatever their partitions and order."""
    kafka = KafkaOffsets(env.kafka)
    offsets = kafka.offsets(kafka.partitions((topic,)))
    ranges = [(t, p, o.log_start, o.last_stable) for (t, p), o in offsets.items()]
    consumer = plain_consumer.consumer(env.kafka, ranges)
    found = Counter((m.key(), tuple(sorted(json.loads(m.value()).items())), tuple(m.headers() or ()) if headers else ())
                    for m in plain_consumer.consume(consumer, ranges))
    consumer.close()
    return found


def topic_totals(env: Env, topic: str) -> dict:
    """Ground truth, independent of the pipeline: scripts/bench/peers/plain_consumer's read_committed read and
    aggregate of the whole topic, {(page, minute): (views, total duration)}."""
    probe = plain_consumer.consumer(env.kafka, [])
    partitions = probe.list_topics(topic, timeout=30).topics[topic].partitions
    ranges = [(topic, p, *probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)) for p in partitions]
    probe.close()
    reader = plain_consumer.consumer(env.kafka, ranges)
    _, totals = plain_consumer.aggregate(plain_consumer.consume(reader, ranges), "page")
    reader.close()
    return {key: tuple(v) for key, v in totals.items()}


def same_rows(cur, expected: str, actual: str, columns: list[str]) -> int:
    """Rows of one table not in the other, both ways (0: the same result)."""
    cols = ", ".join(columns)
    cur.execute(f"SELECT count(*) FROM ((SELECT {cols} FROM {expected} EXCEPT ALL SELECT {cols} FROM {actual})"
                f" UNION ALL (SELECT {cols} FROM {actual} EXCEPT ALL SELECT {cols} FROM {expected})) differ")
    return cur.fetchone()[0]


def check_same_rows(env: Env, label: str, read: int, records: int, expected: str, table: str,
                    columns: list[str]) -> None:
    """A peer's time counts only for the pipeline's result: it read `records`, and its `table` holds exactly
    the rows of the pipeline's `expected` (compared on `columns`); else the bench stops, keeping the table."""
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        differ = same_rows(cur, expected, table, columns)
    conn.close()
    if read != records or differ:
        raise RuntimeError(f"{label}: read {read:,} of {records:,} records; {differ} rows differ from the pipeline's"
                           f" {expected} (its table {table} is kept)")
