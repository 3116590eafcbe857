"""What a user writes without the project, each run as its own process or in a fresh one: the raw read, the
project's reader alone, the plain consumers (JSON, Avro, upsert) and the plain exactly-once publisher."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from bench.env import Env, spans, topic_partitions
from bench.harness import CHILD_TIMEOUT_S, row, settle
from bench.peers import plain_consumer
from bench.sampling import ProcessSampler, own_cpu
from kafka_batch.spark.reader import read_task
from kafka_batch_dev import sample_data


def raw_read(env: Env, ranges) -> int:
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    count = sum(1 for _ in plain_consumer.consume(consumer, spans(ranges)))
    consumer.close()
    return count


def project_read(env: Env, pipeline, ranges) -> int:
    from kafka_batch.spark.job import _columns, _values, value_decoder

    decoder = value_decoder(pipeline, lambda _pipeline: None)
    return sum(b.num_rows for b in read_task(env.kafka, list(ranges), pipeline.read.model_dump(), _columns(pipeline),
                                             decoder, _values(pipeline, decoder)))


def baseline_tables(env: Env, name: str) -> list[tuple[str, str]]:
    return [("public", f"{env.prefix}_{name}_totals"), ("public", f"{env.prefix}_{name}_offsets")]


def baseline(env: Env, ranges, name: str, group: str = "page") -> int:
    """The hand-written job (scripts/bench/peers/plain_consumer.py): consume, parse with json, aggregate in a dict by
    (`group`, minute), commit with compare-and-set (into tables of its own `name`, `baseline_tables`: one
    pair per round)."""
    return plain_consumer.run(env.kafka, env.postgres, spans(ranges), f"{env.prefix}_{name}", group)


def avro_baseline(env: Env, ranges, name: str) -> int:
    """The hand-written job on Avro values: consume, decode with confluent-kafka's AvroDeserializer (the
    registry's writer schema, read as the sample's view), aggregate by (page, country, minute of
    viewed_at), commit with compare-and-set."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserialize = AvroDeserializer(SchemaRegistryClient({"url": env.registry["url"]}),
                                   json.dumps(sample_data.PAGE_VIEW_V2))
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    totals: dict = defaultdict(lambda: [0, 0])
    count = 0
    for m in plain_consumer.consume(consumer, spans(ranges)):
        count += 1
        record = deserialize(m.value(), SerializationContext(m.topic(), MessageField.VALUE))
        t = totals[(record["page"] + "/" + record["country"], record["viewed_at"].replace(second=0, microsecond=0))]
        t[0] += 1
        t[1] += record["duration_ms"]
    consumer.close()
    plain_consumer.commit(env.postgres, spans(ranges), f"{env.prefix}_{name}", totals)
    return count


def upsert_baseline(env: Env, ranges, name: str) -> int:
    """What a user writes without the project (the Kafka Connect JDBC sink's way): per consumed chunk, the
    last record per key upserted with execute_values, tombstones deleted, and the offsets moved by
    compare-and-set, in one transaction."""
    import psycopg2
    from psycopg2.extras import execute_values

    table = f"{env.prefix}_{name}"
    conn = psycopg2.connect(**env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (customer_id text PRIMARY KEY, name text, balance bigint,"
                    " updated_at timestamptz)")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_offsets (topic text, partition int, next_offset bigint,"
                    " PRIMARY KEY (topic, partition))")
        execute_values(cur, f"INSERT INTO {table}_offsets VALUES %s ON CONFLICT DO NOTHING",
                       [(r.topic, r.partition, r.from_offset) for r in ranges])
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    ends = {(r.topic, r.partition): r.until_offset for r in ranges}
    count, chunk, positions = 0, {}, {}
    messages = plain_consumer.consume(consumer, spans(ranges))

    def flush():
        with conn, conn.cursor() as cur:
            for (topic, partition), (start, end) in positions.items():
                cur.execute(f"UPDATE {table}_offsets SET next_offset = %s WHERE topic = %s AND partition = %s"
                            " AND next_offset = %s", (end, topic, partition, start))
                if cur.rowcount != 1:
                    raise RuntimeError("compare-and-set lost")
            rows = [(k, v["name"], v["balance"], datetime.fromtimestamp(v["updated_at"] / 1000, UTC))
                    for k, v in chunk.items() if v is not None]
            if rows:
                execute_values(cur, f"INSERT INTO {table} VALUES %s ON CONFLICT (customer_id) DO UPDATE SET"
                               " name = EXCLUDED.name, balance = EXCLUDED.balance, updated_at = EXCLUDED.updated_at", rows)
            gone = [k for k, v in chunk.items() if v is None]
            if gone:
                cur.execute(f"DELETE FROM {table} WHERE customer_id = ANY(%s)", (gone,))
        chunk.clear()
        positions.clear()

    for m in messages:
        count += 1
        key = (m.topic(), m.partition())
        start = positions.get(key, (None, None))[0]
        positions[key] = (m.offset() if start is None else start, m.offset() + 1)
        chunk[m.key().decode()] = None if m.value() is None else json.loads(m.value())
        if count % 10_000 == 0 or m.offset() + 1 >= ends[key]:
            flush()
    flush()
    consumer.close()
    conn.close()
    return count


def plain_process(env: Env, ranges: list[tuple[str, int, int, int]], rounds: int = 3,
                  name: str = "plain consumer process") -> dict:
    """The plain consumer over `ranges` as a whole process (scripts/bench/peers/plain_consumer.py: interpreter start,
    imports, consume, json, dict, CAS commit), wall-clock from its start; the best of `rounds`."""
    script = str(Path(__file__).with_name("plain_consumer.py"))
    records = sum(until - start for _, _, start, until in ranges)
    for _ in range(rounds):
        settle()
        table = f"{env.prefix}_plain_{uuid.uuid4().hex[:8]}"
        env.tables += [("public", f"{table}_offsets"), ("public", f"{table}_totals")]
        with ProcessSampler(connect=False) as sampled:
            started = time.monotonic()
            subprocess.run([sys.executable, script, "--kafka", json.dumps(env.kafka), "--postgres",
                            json.dumps(env.postgres), "--ranges", json.dumps(ranges), "--table", table], check=True,
                           capture_output=True, timeout=CHILD_TIMEOUT_S)
            seconds = time.monotonic() - started
        cpu = sampled.cpu_seconds()
        best = row(name, seconds, "s", f"plain_consumer.py over {records:,} records, whole process; CPU s by process"
                   f" {cpu}", own_cpu(cpu), records, cpu_by_process=cpu)
    return best


def plain_publisher_run(env: Env, batch, output: str, lineage: str | None = None) -> float:
    """scripts/bench/peers/plain_publisher.py over the batch's ranges into a new topic `output`, its whole process
    timed; `lineage`: `pipeline:batch`, for the sink's headers. Its seconds."""
    sample_data.ensure_topic(env.kafka, output, topic_partitions(env, batch.ranges[0].topic))
    command = [sys.executable, str(Path(__file__).with_name("plain_publisher.py")), "--kafka", json.dumps(env.kafka),
               "--ranges", json.dumps(spans(batch.ranges)), "--output", output, *(["--lineage", lineage] if lineage else [])]
    settle()
    with ProcessSampler(connect=False) as sampled:
        started = time.monotonic()
        subprocess.run(command, check=True, capture_output=True, timeout=CHILD_TIMEOUT_S)
        seconds = time.monotonic() - started
    cpu = sampled.cpu_seconds()
    return row(f"plain exactly-once publisher process{', with the lineage headers' if lineage else ''}", seconds, "s",
               f"plain_publisher.py over {batch.span:,} records, whole process; CPU s by process {cpu}", own_cpu(cpu),
               batch.span, cpu_by_process=cpu)["value"]
