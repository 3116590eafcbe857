"""Debezium's JDBC sink on Kafka Connect standalone beside the upsert sink, checked to give the pipeline's
rows before its time counts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from bench.checks import same_rows
from bench.env import Env, spans, topic_partitions
from bench.harness import row, settle
from bench.peers import launch as peer_launch
from bench.peers import plain_consumer
from bench.sampling import ProcessSampler, own_cpu
from kafka_batch.core import database
from kafka_batch.spark.submit import spark_environment
from kafka_batch_dev import local_stack, sample_data

CUSTOMER_SCHEMA = {"type": "struct", "name": "customer", "optional": False, "fields": [
    {"field": "name", "type": "string", "optional": False},
    {"field": "balance", "type": "int64", "optional": False},
    {"field": "updated_at", "type": "int64", "name": "org.apache.kafka.connect.data.Timestamp", "version": 1,
     "optional": False}]}


CUSTOMER_KEY_SCHEMA = {"type": "struct", "name": "customer_key", "optional": False, "fields": [
    {"field": "customer_id", "type": "string", "optional": False}]}


UPSERT_COLUMNS = ["customer_id", "name", "balance", "updated_at"]


def copy_with_schemas(env: Env, ranges, topic: str) -> None:
    """The customers of `ranges` again in `topic`, each record in its partition and order, its value with
    its schema (Kafka Connect's JSON converter's envelope, which Debezium's JDBC sink needs to know its
    columns; its key likewise, a struct of customer_id, as Debezium's own connectors write keys), tombstones
    kept: the same changes in the form the connector reads."""
    sample_data.ensure_topic(env.kafka, topic, len(ranges))
    producer = Producer({"bootstrap.servers": env.kafka["bootstrap.servers"], "enable.idempotence": True,
                         "linger.ms": 20, "batch.num.messages": 10_000})
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    for m in plain_consumer.consume(consumer, spans(ranges)):
        value = None
        if m.value() is not None:
            record = json.loads(m.value())
            value = json.dumps({"schema": CUSTOMER_SCHEMA, "payload": {k: record[k] for k in ("name", "balance",
                                                                                               "updated_at")}})
        key = json.dumps({"schema": CUSTOMER_KEY_SCHEMA, "payload": {"customer_id": m.key().decode()}})
        sample_data.send(producer, topic, key, value, partition=m.partition())
    consumer.close()
    sample_data.flush(producer, topic, 300)


def debezium_run(env: Env, topic: str, records: int, expected: str, n: int) -> float:
    """Kafka Connect standalone with Debezium's JDBC sink from `topic` into a new table, timed from its start
    until the table holds exactly the pipeline's rows (`expected`), the moment a user could read it; then
    stopped. Its seconds."""
    table = f"{env.prefix}_debezium_{n}"
    env.tables.append(("public", table))
    conn = database.connect(env.postgres)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (customer_id text PRIMARY KEY, name text, balance bigint,"
                    " updated_at timestamptz)")
        cur.execute(f"SELECT count(*) FROM {expected}")
        (rows,) = cur.fetchone()
    work = Path(tempfile.mkdtemp(prefix="kafka_batch_connect_"))
    tasks = min(topic_partitions(env, topic), os.cpu_count() or 2)
    command = peer_launch.connect_command(local_stack.home(), work, env.kafka, env.postgres, topic, table, tasks)
    settle()  # timed from a nearly idle machine
    log = open(work / "connect.log", "wb")
    with ProcessSampler(connect=False) as sampled:  # until Kafka Connect has stopped
        started = time.monotonic()
        connect_worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                                                                               **spark_environment()})
        try:
            with conn.cursor() as cur:
                while True:
                    failed = "will not recover until manually restarted" in (work / "connect.log").read_text()
                    if connect_worker.poll() is not None or failed:
                        raise RuntimeError(f"Kafka Connect exited ({connect_worker.returncode}) or its task failed: "
                                           f"{(work / 'connect.log').read_text()[-3000:]}")
                    if time.monotonic() - started > 900:
                        raise RuntimeError(f"Debezium's JDBC sink did not complete {table} in 900 s; see {work}")
                    cur.execute(f"SELECT count(*) FROM {table}")
                    if cur.fetchone()[0] == rows and not same_rows(cur, expected, table, UPSERT_COLUMNS):
                        break
                    time.sleep(0.25)
            seconds = time.monotonic() - started
        finally:
            connect_worker.terminate()
            connect_worker.wait(60)
            log.close()
            conn.close()
    shutil.rmtree(work, ignore_errors=True)
    cpu = sampled.cpu_seconds()
    row(f"Debezium JDBC sink, {records / 1e6:g}M", records / seconds, "records/s",
        f"{records:,} records into {rows:,} rows in {seconds:.1f}s, Kafka Connect standalone from its start to the"
        f" table equal to the pipeline's ({tasks} tasks); CPU s by process until it stopped {cpu}", own_cpu(cpu),
        records, seconds=round(seconds, 2), cpu_by_process=cpu)
    return seconds
