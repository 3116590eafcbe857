"""`make demo-customers`: mirror a keyed topic and a Debezium topic into Postgres, rewind, run again.

Runs the `customers` and `customers_cdc` sample pipelines through `kafka-batch` against the services of
`make up`. After every step the tables are compared with what they must hold, computed here without
the pipeline's code: the topic's own compaction (a plain read_committed consumer, the last record per
key, tombstones deleting), and for the change events the source table the generator changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg2

from kafka_batch import connections
from kafka_batch.config import load_pipeline
from kafka_batch_dev import sample_data
from kafka_batch_dev.committed import committed_messages

CLI = str(Path(sys.executable).parent / "kafka-batch")
COMMAND_TIMEOUT_S = 1200  # a command of this demo takes seconds; one still going after this has hung


def kafka_batch(*args: str) -> str:
    print(f"\n$ kafka-batch {' '.join(args)}")
    try:
        result = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"kafka-batch {args[0]} did not end within {COMMAND_TIMEOUT_S // 60} minutes")
    if result.returncode != 0:
        sys.exit(f"kafka-batch {args[0]} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def compaction(kafka: dict, topic: str, positions: dict[int, int]) -> dict[str, tuple]:
    """customer -> (name, balance) of the last record per key below the positions, tombstones deleting."""
    latest: dict[str, dict | None] = {}
    for m in committed_messages(kafka, topic, below=positions):  # a key lives in one partition: the later offset is the latest
        latest[m.key().decode()] = None if m.value() is None else json.loads(m.value())
    return {k: (v["name"], v["balance"]) for k, v in latest.items() if v is not None}


def changes_compacted(kafka: dict, topic: str, positions: dict[int, int]) -> dict[str, tuple]:
    """customer -> (name, balance) of the change event with the highest lsn per key, deletes deleting."""
    latest: dict[str, tuple[int, dict | None]] = {}
    for m in committed_messages(kafka, topic, below=positions):
        if m.value() is None:
            continue  # the tombstone after a delete: the delete event said it
        event = json.loads(m.value())["payload"]
        row = event["before"] if event["op"] == "d" else event["after"]
        lsn = event["source"]["lsn"]
        if row["customer_id"] not in latest or lsn > latest[row["customer_id"]][0]:
            latest[row["customer_id"]] = (lsn, None if event["op"] == "d" else row)
    return {k: (r["name"], r["balance"]) for k, (_, r) in latest.items() if r is not None}


def mirrored(cur, table: str) -> dict[str, tuple]:
    cur.execute(f"SELECT customer_id, name, balance FROM {table}")
    return {k: (name, balance) for k, name, balance in cur.fetchall()}


def positions(cur, pipeline: str) -> dict[int, int]:
    cur.execute("SELECT partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s", (pipeline,))
    return dict(cur.fetchall())


def show(cur, table: str, customer: str) -> None:
    cur.execute(f"SELECT count(*) FROM {table}")
    print(f"  {table}: {cur.fetchone()[0]} rows; customer {customer}:")
    cur.execute(f"SELECT customer_id, name, balance, kafka_partition, kafka_offset FROM {table} WHERE customer_id = %s",
                (customer,))
    row = cur.fetchone()
    print("    " + (" | ".join(map(str, row)) if row else "(absent)"))


def verdict(what: str, got: dict, expected: dict) -> None:
    if got != expected:
        wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
        sys.exit(f"  MISMATCH {what}: {len(wrong)} customer(s) differ, e.g. {wrong[:5]}")
    print(f"  {what}: equal, {len(got)} customers")


def main() -> int:
    customers, cdc = load_pipeline("customers"), load_pipeline("customers_cdc")
    kafka = connections.kafka_config(connections.from_environment(customers.connections.kafka))
    postgres = connections.postgres_params(connections.from_environment(customers.connections.postgres))
    topic, cdc_topic = customers.topics[0], cdc.topics[0]
    sample_data.ensure_topic(kafka, topic, partitions=3)
    sample_data.ensure_topic(kafka, cdc_topic, partitions=2)
    conn = psycopg2.connect(**postgres)
    conn.autocommit = True
    cur = conn.cursor()
    seed = int(time.time())

    print(f"== a keyed topic: customer updates and tombstones to {topic!r}")
    sample_data.produce_customers(kafka, topic, 20_000, seed=seed)
    kafka_batch("run", "--pipeline", customers.name)
    first = positions(cur, customers.name)
    sample_data.produce_customers(kafka, topic, 5_000, seed=seed + 1)
    kafka_batch("run", "--pipeline", customers.name)
    table = customers.sinks[0].table
    cur.execute(f"SELECT customer_id FROM {table} ORDER BY kafka_offset DESC LIMIT 1")
    (changed,) = cur.fetchone()
    show(cur, table, changed)
    verdict("the table and the topic's compaction", mirrored(cur, table), compaction(kafka, topic, positions(cur, customers.name)))

    print("\n== rewind to where the first batch ended, then run again")
    for partition, offset in sorted(first.items()):
        kafka_batch("reset", "--pipeline", customers.name, "--topic", topic, "--partitions", str(partition),
                    "--to-offset", str(offset), "--reason", "demo rewind", "--execute")
    show(cur, table, changed)
    verdict("after the rewind, the compaction of the first batch's records", mirrored(cur, table),
            compaction(kafka, topic, first))
    kafka_batch("run", "--pipeline", customers.name)
    show(cur, table, changed)
    verdict("after running again", mirrored(cur, table), compaction(kafka, topic, positions(cur, customers.name)))

    print(f"\n== Debezium change events of a customers table to {cdc_topic!r}")
    fresh = not positions(cur, cdc.name)
    source_table: dict[str, dict] = {}
    sample_data.produce_customer_changes(kafka, cdc_topic, 3_000, source_table, seed=seed, first_lsn=seed * 1_000)
    kafka_batch("run", "--pipeline", cdc.name)
    mirror = mirrored(cur, cdc.sinks[0].table)
    verdict("the mirror and the change events' compaction by lsn", mirror,
            changes_compacted(kafka, cdc_topic, positions(cur, cdc.name)))
    if fresh:  # the first run: the mirror must also equal the table the generator changed
        verdict("the mirror and the source table", mirror, {k: (r["name"], r["balance"]) for k, r in source_table.items()})
    conn.close()
    print("\nDemo done. `make down` stops the local services.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
