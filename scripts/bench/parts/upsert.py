"""The `upsert` part: the upsert sink against the plain consumer and Debezium's JDBC sink, and its commit
(target 7)."""

from __future__ import annotations

import argparse
import time

import pyarrow as pa
import yaml
from psycopg2 import sql

from bench.env import CONNECT, MODE, SUBMIT, Env, produce_per_partition
from bench.harness import row, settle
from bench.peers.debezium import copy_with_schemas, debezium_run
from bench.peers.plain import upsert_baseline
from bench.runs import mode_targets, read_row, side_by_side
from kafka_batch.config import PROJECT_ROOT, load_pipeline
from kafka_batch.core import attempts, database
from kafka_batch.core.commit import commit_batch
from kafka_batch.sinks.base import RangeCounts, SinkOutput
from kafka_batch_dev import sample_data


def upsert_pipeline(env: Env, name: str, topic: str, spark: str):
    """The `customers` sample on the bench's topic, with tables of its own."""
    definition = yaml.safe_load((PROJECT_ROOT / "pipelines" / "customers.yaml").read_text())
    name = f"{env.prefix}_{name}"
    definition.update(name=name, topics=[topic], connections={"spark": spark},
                      limits={"max_records_per_partition": 10**9, "max_records_per_batch": 10**9})
    definition["sinks"]["upsert"]["table"] = name
    (env.pipelines / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    pipeline = load_pipeline(name)
    [sink] = pipeline.sinks
    env.tables += [("public", sink.table), ("kafka_batch", sink.history_name)]
    return pipeline


def history_size(env: Env, pipeline, records: int) -> None:
    [sink] = pipeline.sinks
    table = sql.Identifier("kafka_batch", sink.history_name)
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT pg_total_relation_size(%s), count(*), count(DISTINCT customer_id) FROM {}")
                    .format(table), (table.as_string(cur),))
        size, rows, keys = cur.fetchone()
    conn.close()
    row("upsert history table", size / 2**20 / (records / 1e6), "MB/M records",
        f"{rows:,} rows for {keys:,} keys, {size / 2**20:.1f} MB with indexes after {records:,} records (one row per"
        " key and range that changed it; the replay horizon folds older ranges into one row per key)", rows=rows)


def upsert_commit(env: Env, keys: int, name: str = "upsert_commit") -> tuple[float, float]:
    """commit_batch of an upsert result of `keys` keys staged as the executors stage it: once into an empty
    table (inserts), then the same keys changed (a second batch: updates against their history). `name`:
    the pipeline's and its topic's, new for each measure."""
    from kafka_batch.sinks import staging
    from kafka_batch.sinks.base import copy_arrow

    topic = f"{env.prefix}_{name}"
    sample_data.ensure_topic(env.kafka, topic, 4)
    pipeline = upsert_pipeline(env, name, topic, SUBMIT)
    [sink] = pipeline.sinks
    seconds = []
    for n in range(2):
        produce_per_partition(env.kafka, topic, 4, 10, seed=3 + n)
        batch = env.plan(pipeline, run_id=f"commit-{n}")
        conn = database.connect(env.postgres)
        try:
            attempt = attempts.claim_attempt(conn, batch.id)
            name = staging.create_stage(env.postgres, batch.id, attempt, sink.kind, sql.Identifier("kafka_batch",
                                                                                                     sink.history_name))
            ids = [r.range_id for r in batch.ranges]
            rows = pa.table({
                "range_id": pa.array([ids[i % len(ids)] for i in range(keys)], pa.int64()),
                "customer_id": pa.array([f"c{i:07d}" for i in range(keys)]),
                "deleted": pa.array([False] * keys),
                "kafka_topic": pa.array([topic] * keys),
                "kafka_partition": pa.array([i % len(ids) for i in range(keys)], pa.int32()),
                "kafka_offset": pa.array([n * keys + i for i in range(keys)], pa.int64()),
                "name": pa.array([f"name {n}"] * keys),
                "balance": pa.array([i + n for i in range(keys)], pa.int64()),
                "updated_at": pa.array([1_700_000_000_000_000 + i for i in range(keys)], pa.timestamp("us", tz="UTC")),
            })
            with conn, conn.cursor() as cur:
                copy_arrow(cur, staging.staged(name), rows.select(sink.history_columns))
            counts = {rid: RangeCounts(records=10) for rid in ids}
            settle()  # timed from a nearly idle machine
            started = time.monotonic()
            commit_batch(conn, pipeline, batch.id, attempt, {"upsert": SinkOutput(counts, staging.StagedRows(name, keys))}, 1)
            seconds.append(time.monotonic() - started)
        finally:
            conn.close()
    return seconds[0], seconds[1]


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The upsert line: its rows and its targets."""
    topic = f"{env.prefix}_customers"
    sample_data.ensure_topic(env.kafka, topic, args.partitions)
    sample_data.produce_customers(env.kafka, topic, args.upsert_records, seed=9, customers=args.upsert_keys,
                                  delete_share=0.05)
    jobs = [(f"upsert, {MODE[spark]}", upsert_pipeline(env, f"upsert_{i}_{spark}", topic, spark))
            for i in range(args.repeat) for spark in (CONNECT, SUBMIT)]
    planned = [(label, pipeline, env.plan(pipeline)) for label, pipeline in jobs]
    ranges = planned[0][2].ranges
    def baseline_round(i: int) -> dict:
        env.tables += [("public", f"{env.prefix}_upsert_baseline_{i}"), ("public", f"{env.prefix}_upsert_baseline_{i}_offsets")]
        return read_row("upsert plain consumer", "consume + json + execute_values upserts per chunk + CAS",
                        upsert_baseline, env, ranges, f"upsert_baseline_{i}")

    base, best = side_by_side(args.repeat, planned, baseline_round, env)
    history_size(env, planned[0][1], planned[0][2].span)
    with_schemas = f"{topic}_with_schemas"
    copy_with_schemas(env, planned[0][2].ranges, with_schemas)
    debezium_s = min(debezium_run(env, with_schemas, planned[0][2].span, planned[0][1].sinks[0].table, i)
                     for i in range(args.repeat))
    for i in range(args.repeat):
        inserted_s, changed_s = upsert_commit(env, args.upsert_commit_keys, f"upsert_commit_{i}")
        commit = row("upsert commit", changed_s, "s", f"{args.upsert_commit_keys:,} changed keys (first commit, all"
                     f" new keys: {inserted_s:.2f} s)", first_commit_s=round(inserted_s, 2))
    return [
        *mode_targets(7, "upsert", planned[0][2].span, base, best),
        (f"7 upsert: kafka-batch run / Debezium JDBC sink >= 1.5, {MODE[CONNECT]}",
         debezium_s / best[f"upsert, {MODE[CONNECT]}"], 1.5, ">="),
        (f"7 upsert commit of {args.upsert_commit_keys // 1000}k changed keys (s) <= 2", commit["value"], 2, "<="),
    ]
