"""The `commit` part: commit_batch of many aggregate contribution rows (target 5)."""

from __future__ import annotations

import argparse
import random
import time

import pyarrow as pa

from bench.env import Env, produce_per_partition
from bench.harness import row, settle
from kafka_batch.core import attempts, database
from kafka_batch.core.commit import commit_batch
from kafka_batch.sinks.base import RangeCounts, SinkOutput
from kafka_batch_dev import sample_data


def commit_rows(env: Env, rows: int, name: str = "commit", ranges_per_key: int = 1) -> float:
    """commit_batch of `rows` (range, page, minute) contributions over 4 ranges. `name`: the pipeline's and
    its topic's, new for each measure (a committed batch leaves nothing to plan). `ranges_per_key` (1-4):
    in how many ranges each key has a row; above 1 the rows come in random order, as Spark's hash aggregate
    hands a result over, and the commit adds a key's rows up before the totals."""
    topic = f"{env.prefix}_{name}"
    sample_data.ensure_topic(env.kafka, topic, 4)
    produce_per_partition(env.kafka, topic, 4, 10, seed=3)
    pipeline = env.pipeline(name, topic)
    batch = env.plan(pipeline)
    ids = [r.range_id for r in batch.ranges]
    base = 1_700_000_000_000_000
    keys = rows // ranges_per_key
    key = [i % keys for i in range(rows)]
    result = pa.table({  # key k's c-th row (c = i // keys) in the range after its c-1-th: another for each
        "range_id": pa.array([ids[(k + i // keys) % len(ids)] for i, k in enumerate(key)], pa.int64()),
        "page": pa.array([f"/page/{k}" for k in key], pa.string()),
        "minute": pa.array([base + (k % 1000) * 60_000_000 for k in key], pa.timestamp("us", tz="UTC")),
        "views": pa.array([1] * rows, pa.int64()),
        "total_duration_ms": pa.array(key, pa.int64()),
    })
    if ranges_per_key > 1:
        result = result.take(pa.array(random.Random(7).sample(range(rows), rows)))
    counts = {rid: RangeCounts(records=10) for rid in ids}
    conn = database.connect(env.postgres)
    try:
        attempt = attempts.claim_attempt(conn, batch.id)
        settle()  # timed from a nearly idle machine
        started = time.monotonic()
        commit_batch(conn, pipeline, batch.id, attempt, {"aggregate": SinkOutput(counts, result)}, 1)
        seconds = time.monotonic() - started
    finally:
        conn.close()
    return seconds


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    for i in range(args.repeat):
        commit = row("commit", commit_rows(env, args.commit_rows, f"commit_{i}"), "s",
                     f"{args.commit_rows:,} distinct contribution rows")
    return [(f"5 commit of {args.commit_rows // 1000}k rows (s) <= 2", commit["value"], 2, "<=")]
