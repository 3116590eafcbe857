"""The `commit` part: commit_batch of many aggregate contribution rows (target 5)."""

from __future__ import annotations

import argparse
import time

import pyarrow as pa

from bench.env import Env, produce_per_partition
from bench.harness import row, settle
from kafka_batch.core import attempts, database
from kafka_batch.core.commit import commit_batch
from kafka_batch.sinks.base import RangeCounts, SinkOutput
from kafka_batch_dev import sample_data


def commit_rows(env: Env, rows: int, name: str = "commit") -> float:
    """commit_batch of `rows` distinct (range, page, minute) contributions, spread over 4 ranges. `name`: the
    pipeline's and its topic's, new for each measure (a committed batch leaves nothing to plan)."""
    topic = f"{env.prefix}_{name}"
    sample_data.ensure_topic(env.kafka, topic, 4)
    produce_per_partition(env.kafka, topic, 4, 10, seed=3)
    pipeline = env.pipeline(name, topic)
    batch = env.plan(pipeline)
    ids = [r.range_id for r in batch.ranges]
    base = 1_700_000_000_000_000
    result = pa.table({
        "range_id": pa.array([ids[i % len(ids)] for i in range(rows)], pa.int64()),
        "page": pa.array([f"/page/{i}" for i in range(rows)], pa.string()),
        "minute": pa.array([base + (i % 1000) * 60_000_000 for i in range(rows)], pa.timestamp("us", tz="UTC")),
        "views": pa.array([1] * rows, pa.int64()),
        "total_duration_ms": pa.array([i for i in range(rows)], pa.int64()),
    })
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
