"""The `many-keys` part: an aggregate over about as many keys as records (target 8)."""

from __future__ import annotations

import argparse

from bench.env import CONNECT, MODE, SUBMIT, Env
from bench.harness import row
from bench.parts.commit import commit_rows
from bench.peers.plain import baseline, baseline_tables
from bench.runs import mode_targets, read_row, side_by_side
from kafka_batch.core import database
from kafka_batch_dev import sample_data


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The high-cardinality aggregate: records over about as many (user, minute) keys, the whole job
    against the plain consumer (same aggregation), and the commit of that many contribution rows, each key
    in one range and each in two."""
    topic = f"{env.prefix}_many_keys"
    sample_data.ensure_topic(env.kafka, topic, args.partitions)
    sample_data.produce_page_views(env.kafka, topic, args.many_keys_records, seed=11, users=args.many_keys_users)
    planned = [(label, pipeline, env.plan(pipeline)) for label, pipeline in (
        (f"many keys, {MODE[spark]}", env.pipeline(f"many_keys_{i}_{spark}", topic, spark, group="user_id"))
        for i in range(args.repeat) for spark in (CONNECT, SUBMIT))]
    def baseline_round(i: int) -> dict:
        env.tables += baseline_tables(env, f"many_keys_baseline_{i}")
        return read_row("many keys plain consumer", "consume + json + dict by (user, minute) + CAS commit", baseline,
                        env, planned[0][2].ranges, f"many_keys_baseline_{i}", "user_id")

    base, best = side_by_side(args.repeat, planned, baseline_round, env)
    pipeline = planned[0][1]
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {pipeline.sinks[0].table}")
        (keys,) = cur.fetchone()
    conn.close()
    row("many keys: distinct keys", keys, "keys", f"(user, minute) keys of {planned[0][2].span:,} records")
    for i in range(args.repeat):
        commit = row("commit, many keys", commit_rows(env, args.many_keys_records, f"commit_many_{i}"), "s",
                     f"{args.many_keys_records:,} distinct contribution rows")
    for i in range(args.repeat):
        spread = row("commit, many keys in 2 ranges each",
                     commit_rows(env, args.many_keys_records, f"commit_spread_{i}", ranges_per_key=2), "s",
                     f"{args.many_keys_records:,} contribution rows of {args.many_keys_records // 2:,} keys, in random order")
    return [
        *mode_targets(8, "many keys", planned[0][2].span, base, best),
        (f"8 commit of {args.many_keys_records / 1e6:g}M contribution rows (s) <= 2", commit["value"], 2, "<="),
        ("8 the same, each key in 2 ranges (s) <= 2", spread["value"], 2, "<="),
    ]
