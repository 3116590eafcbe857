"""`make demo`: produce page views, run the DAG through Airflow, show offsets and totals, twice; then
the same with Avro page views through the Schema Registry, whose schema gains a field half way; then
the per-page totals published to a compacted Kafka topic (the Kafka sink), read back and checked.

Runs against the services of `make up` (the environment of .local/env.sh). Each DAG run must add
exactly the records produced since the previous one: the script checks it and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psycopg2

from kafka_batch import connections
from kafka_batch.config import load_pipeline
from kafka_batch_dev import local_stack, sample_data
from kafka_batch_dev.committed import committed_messages

PIPELINE, AVRO_PIPELINE, TOTALS_PIPELINE = "page_views", "page_views_avro", "page_view_totals"
FIRST, SECOND = 20_000, 5_000
AVRO = 10_000  # Avro page views: the first half written with version 1 of the schema, the rest with version 2
# A DAG run of the demo takes about a minute; one still going after this has hung (its tasks' own bounds
# and retries included).
DAG_RUN_TIMEOUT_S = 1800


def run_dag(dag_id: str, log_path: str) -> None:
    print(f"\n$ airflow dags test {dag_id}   (log: {log_path})")
    started = time.monotonic()
    with open(log_path, "w") as log:
        try:
            result = subprocess.run(["airflow", "dags", "test", dag_id], stdout=log, stderr=subprocess.STDOUT,
                                    timeout=DAG_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            sys.exit(f"the DAG run did not end within {DAG_RUN_TIMEOUT_S // 60} minutes; see {log_path}")
    if result.returncode != 0:
        sys.exit(f"the DAG run failed (exit {result.returncode}); see {log_path}")
    print(f"  DAG run succeeded in {time.monotonic() - started:.0f}s")


def show(cur, pipeline: str, table: str) -> int:
    cur.execute(
        "SELECT topic, partition, next_offset, batch_id FROM kafka_batch.offsets WHERE pipeline = %s ORDER BY 1, 2",
        (pipeline,),
    )
    print(f"  committed offsets of pipeline {pipeline}:")
    for topic, partition, offset, batch in cur.fetchall():
        print(f"    {topic}[{partition}] next_offset={offset} (batch {batch})")
    cur.execute(f"SELECT page, minute, views, total_duration_ms FROM {table} ORDER BY views DESC, page LIMIT 5")
    print(f"  top rows of {table}:")
    for page, minute, views, duration in cur.fetchall():
        print(f"    {page:<12} {minute:%Y-%m-%d %H:%M} views={views:<6} total_duration_ms={duration}")
    cur.execute(f"SELECT coalesce(sum(views), 0) FROM {table}")
    total = cur.fetchone()[0]
    print(f"  total views: {total}")
    return total


def main() -> int:
    pipeline = load_pipeline(PIPELINE)
    kafka = connections.kafka_config(connections.from_environment(pipeline.connections.kafka))
    postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
    topic = pipeline.topics[0]
    sample_data.ensure_topic(kafka, topic, partitions=3)
    log_dir = os.path.join(os.environ["AIRFLOW_HOME"], "demo-logs")
    os.makedirs(log_dir, exist_ok=True)

    # Catch up first, so the figures below count only what this demo produces.
    run_dag(pipeline.dag_id, os.path.join(log_dir, "run-0.log"))
    conn = psycopg2.connect(**postgres)
    conn.autocommit = True
    with conn.cursor() as cur:
        before = show(cur, pipeline.name, pipeline.sinks[0].table)
        for step, count in ((1, FIRST), (2, SECOND)):
            print(f"\n== step {step}: produce {count} page views to {topic!r}")
            sample_data.produce_page_views(kafka, topic, count, seed=int(time.time()))
            run_dag(pipeline.dag_id, os.path.join(log_dir, f"run-{step}.log"))
            after = show(cur, pipeline.name, pipeline.sinks[0].table)
            added = after - before
            verdict = "exactly the new records" if added == count else "MISMATCH"
            print(f"  added {added} views for {count} produced records: {verdict}")
            if added != count:
                return 1
            before = after
        if avro_step(cur, kafka, log_dir) != 0:
            return 1
        if totals_step(cur, kafka, log_dir, pipeline.sinks[0].table) != 0:
            return 1
    conn.close()
    print(f"\nDemo done. {local_stack.console_hint()}\n"
          f"`make down` stops the local services; data stays in {local_stack.home()}.")
    return 0


def _views_by_country(cur, table: str) -> dict[str, int]:
    cur.execute(f"SELECT country, sum(views)::bigint FROM {table} GROUP BY country")
    return dict(cur.fetchall())


def avro_step(cur, kafka: dict, log_dir: str) -> int:
    """Avro records of two schema versions through the registry: every record counted once, and the
    version-1 records (no `country` yet) under the reader view's default, "unknown"."""
    pipeline = load_pipeline(AVRO_PIPELINE)
    registry = connections.schema_registry_config(connections.from_environment(pipeline.connections.schema_registry))
    topic, table = pipeline.topics[0], pipeline.sinks[0].table
    sample_data.ensure_topic(kafka, topic, partitions=3)
    run_dag(pipeline.dag_id, os.path.join(log_dir, "run-avro-0.log"))  # catch up first
    before = _views_by_country(cur, table)
    print(f"\n== Avro: produce {AVRO} page views to {topic!r} through the Schema Registry at {registry['url']}"
          f" (the first {AVRO // 2} with schema version 1, the rest with version 2, which adds `country`)")
    sample_data.produce_page_views_avro(kafka, {"url": registry["url"]}, topic, AVRO, seed=int(time.time()),
                                        changed_at=AVRO // 2)
    run_dag(pipeline.dag_id, os.path.join(log_dir, "run-avro-1.log"))
    after = _views_by_country(cur, table)
    added = {country: after.get(country, 0) - before.get(country, 0) for country in after}
    print(f"  views added per country: {dict(sorted(added.items()))}")
    total, unknown = sum(added.values()), added.get("unknown", 0)
    exact = total == AVRO and unknown == AVRO // 2
    print(f"  added {total} views for {AVRO} produced records, {unknown} of them from version-1 records read with"
          f" the default country: {'exactly the new records' if exact else 'MISMATCH'}")
    return 0 if exact else 1


def _compacted(kafka: dict, topic: str) -> dict[str, dict]:
    """The topic as compaction leaves it, read by a plain read_committed consumer: per key its last value
    (a tombstone removes the key)."""
    latest: dict[str, dict] = {}
    for message in committed_messages(kafka, topic):
        key = json.loads(message.key())["page"]
        if message.value() is None:
            latest.pop(key, None)
        else:
            latest[key] = json.loads(message.value())
    return latest


def totals_step(cur, kafka: dict, log_dir: str, minutes_table: str) -> int:
    """The per-page totals in Postgres and on a compacted topic: the topic, read back by a plain consumer,
    equals the table, whose views equal the per-minute table's (both read every page view)."""
    pipeline = load_pipeline(TOTALS_PIPELINE)
    sink = next(s for s in pipeline.sinks if s.kind == "kafka")
    sample_data.ensure_topic(kafka, sink.topic, partitions=3, settings={"cleanup.policy": "compact"})
    print(f"\n== Kafka sink: per-page totals in table {sink.changelog_of!r} and on the compacted topic {sink.topic!r}")
    run_dag(pipeline.dag_id, os.path.join(log_dir, "run-totals.log"))
    cur.execute(f"SELECT page, views, total_duration_ms FROM {sink.changelog_of} ORDER BY page")
    table = {page: (views, duration) for page, views, duration in cur.fetchall()}
    topic = {page: (row["views"], row["total_duration_ms"]) for page, row in _compacted(kafka, sink.topic).items()}
    for page, (views, duration) in table.items():
        print(f"    {page:<12} views={views:<6} total_duration_ms={duration:<12} topic: {topic.get(page)}")
    cur.execute(f"SELECT coalesce(sum(views), 0) FROM {minutes_table}")
    minutes = cur.fetchone()[0]
    exact = topic == table and sum(v for v, _ in table.values()) == minutes
    print(f"  the compacted topic holds {len(topic)} pages, the table {len(table)}, {minutes} views in both"
          f" pipelines: {'the topic equals the table' if exact else 'MISMATCH'}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
