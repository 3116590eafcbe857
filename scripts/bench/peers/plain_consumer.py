"""The plain consumer `make bench` measures the project against: what a user would write instead.

consume the ranges (stopping at each range's end, never waiting at a partition's end), json.loads each
value, sum views and durations per (group field, minute) in a dict, and commit the totals and the new
offsets in one Postgres transaction by compare-and-set. It imports nothing of the project, so run as
a script its whole process (interpreter start included) is what a user's job would cost:

    python scripts/bench/peers/plain_consumer.py --kafka '{"bootstrap.servers": ...}' --postgres '{"host": ...}' \
        --ranges '[["topic", 0, 0, 1000]]' --table bench_plain
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import psycopg2
from confluent_kafka import Consumer, KafkaError, TopicPartition
from psycopg2.extras import execute_values

# The consumer settings the project's reader uses (kafka_batch.kafka.source), so the two read alike.
TUNED = {"fetch.queue.backoff.ms": 10, "queued.min.messages": 200_000}


def consumer(kafka: dict, ranges: list[tuple[str, int, int, int]]) -> Consumer:
    config = {"bootstrap.servers": kafka["bootstrap.servers"], "group.id": f"bench-{uuid.uuid4().hex[:8]}",
              "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True,
              **TUNED, **{k: v for k, v in kafka.items() if k.startswith(("receive.", "security.", "sasl.", "ssl."))}}
    c = Consumer(config)
    c.assign([TopicPartition(topic, partition, start) for topic, partition, start, _ in ranges])
    return c


def consume(c: Consumer, ranges: list[tuple[str, int, int, int]]):
    """The messages of the ranges; a partition is done once a message at or past its end's last offset,
    or the partition's end at its range's end, is seen."""
    ends = {(topic, partition): until for topic, partition, start, until in ranges if until > start}
    while ends:
        for m in c.consume(10_000, timeout=0.1):
            key = (m.topic(), m.partition())
            if key not in ends:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(m.error())
                if m.offset() >= ends[key]:
                    del ends[key]
                continue
            if m.offset() < ends[key]:
                yield m
            if m.offset() + 1 >= ends[key]:
                del ends[key]


def aggregate(messages, group: str = "page") -> tuple[int, dict]:
    """(records, {(group value, minute): [views, total duration]})."""
    totals: dict = defaultdict(lambda: [0, 0])
    count = 0
    for m in messages:
        count += 1
        value = m.value()
        if value is None:
            continue
        record = json.loads(value)
        t = totals[(record[group], m.timestamp()[1] // 60_000 * 60)]
        t[0] += 1
        t[1] += record["duration_ms"]
    return count, {(key, datetime.fromtimestamp(minute, UTC)): v for (key, minute), v in totals.items()}


def commit(postgres: dict, ranges: list[tuple[str, int, int, int]], table: str, totals: dict) -> None:
    """The positions by compare-and-set and the totals added, in one transaction (tables of its own)."""
    conn = psycopg2.connect(**postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_offsets (topic text, partition int, next_offset bigint,"
                    " PRIMARY KEY (topic, partition))")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_totals (page text, minute timestamptz, views bigint,"
                    " total_duration_ms bigint, PRIMARY KEY (page, minute))")
        execute_values(cur, f"INSERT INTO {table}_offsets VALUES %s ON CONFLICT DO NOTHING",
                       [(topic, partition, start) for topic, partition, start, _ in ranges])
    with conn, conn.cursor() as cur:
        for topic, partition, start, until in ranges:
            cur.execute(f"UPDATE {table}_offsets SET next_offset = %s WHERE topic = %s AND partition = %s"
                        " AND next_offset = %s", (until, topic, partition, start))
            if cur.rowcount != 1:
                raise RuntimeError("compare-and-set lost")
        execute_values(
            cur, f"INSERT INTO {table}_totals VALUES %s ON CONFLICT (page, minute) DO UPDATE SET"
            f" views = {table}_totals.views + EXCLUDED.views,"
            f" total_duration_ms = {table}_totals.total_duration_ms + EXCLUDED.total_duration_ms",
            [(key, minute, v, d) for (key, minute), (v, d) in totals.items()],
        )
    conn.close()


def run(kafka: dict, postgres: dict, ranges: list[tuple[str, int, int, int]], table: str, group: str = "page") -> int:
    c = consumer(kafka, ranges)
    count, totals = aggregate(consume(c, ranges), group)
    c.close()
    commit(postgres, ranges, table, totals)
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka", required=True, help="librdkafka settings, JSON")
    parser.add_argument("--postgres", required=True, help="psycopg2.connect keyword arguments, JSON")
    parser.add_argument("--ranges", required=True, help="[[topic, partition, from, until], ...], JSON")
    parser.add_argument("--table", required=True)
    parser.add_argument("--group", default="page")
    args = parser.parse_args()
    count = run(json.loads(args.kafka), json.loads(args.postgres), [tuple(r) for r in json.loads(args.ranges)],
                args.table, args.group)
    print(count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
