"""The `scale` part: many partitions and a regex subscription, their commit, `status` and the console page
(target 55)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from bench.env import CONNECT, Env, produce_per_partition
from bench.harness import row
from bench.runs import spark_run, warm_up
from kafka_batch.core import database
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch_dev import sample_data


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """Issue 55's many partitions, on Spark Connect (warmed up): a 1,000-record batch and a --scale-records
    (1M) batch over --many (1,000) partitions against the same over 4 (and over 50 and 200 between them,
    for the curve of time against partitions; the big one also over a regex
    subscription to 20 topics of --many/20 partitions, reported beside), the commit phase of the big ones
    (every position and ledger row moved in a few statements), and what `status` and the console's
    pipeline page take for the wide pipeline with every partition behind (before its batch runs)."""
    from kafka_batch.core import inspection, report

    topics = {}
    curve = sorted({4, *(n for n in (50, 200) if n < args.many), args.many}, reverse=True)  # time by partitions
    for size, records in (("small", args.fixed_records), ("big", args.scale_records)):
        for partitions in curve:
            topic = topics[size, partitions] = f"{env.prefix}_scale_{size}_{partitions}"
            sample_data.ensure_topic(env.kafka, topic, partitions)
            produce_per_partition(env.kafka, topic, partitions, max(1, records // partitions), seed=3)
    # The same big batch over a regex subscription: 20 topics of --many/20 partitions.
    pattern = f"{env.prefix}_scale_pattern_[0-9]+"
    for n in range(20):
        topic = f"{env.prefix}_scale_pattern_{n:02}"
        sample_data.ensure_topic(env.kafka, topic, max(1, args.many // 20))
        produce_per_partition(env.kafka, topic, max(1, args.many // 20),
                              max(1, args.scale_records // args.many), seed=4 + n)
    warm_up(env, lambda i: env.pipeline(f"scale_warm_{i}", topics["small", 4], CONNECT))
    runs: dict[tuple, list[dict]] = defaultdict(list)
    status_s, page_s = [], []
    for i in range(args.repeat):
        for (size, partitions), topic in topics.items():
            pipeline = env.pipeline(f"scale_{size}_{partitions}_{i}", topic, CONNECT)
            batch = env.plan(pipeline)
            if (size, partitions) == ("big", args.many):  # every partition behind: what an operator looks at
                conn, kafka = database.connect(env.postgres), KafkaOffsets(env.kafka)
                try:
                    started = time.monotonic()
                    rows = report.status(conn, kafka, pipeline)
                    report.topic_totals((r.topic, r.partition, r.lag, r.last_batch_id) for r in rows)
                    status_s.append(time.monotonic() - started)
                    started = time.monotonic()
                    inspection.partitions(conn, kafka, env.kafka, pipeline)
                    page_s.append(time.monotonic() - started)
                finally:
                    conn.close()
            runs[size, partitions].append(spark_run(env, pipeline, batch, f"{batch.span:,} records over {partitions}"
                                                                           " partitions, Spark Connect"))
        pipeline = env.pipeline(f"scale_pattern_{i}", {"pattern": pattern}, CONNECT)
        batch = env.plan(pipeline)
        runs["pattern", args.many].append(spark_run(env, pipeline, batch, f"{batch.span:,} records over 20 topics"
                                                                          f" of {args.many // 20} partitions, Spark Connect"))
    best = {key: min(found, key=lambda r: r["seconds"]) for key, found in runs.items()}
    commit = {partitions: min(r["phases"].get("commit", float("nan")) for r in runs["big", partitions])
              for partitions in (args.many, 4)}
    row(f"commit of {args.many} ranges", commit[args.many], "s", f"the commit phase of the big batch over {args.many}"
        f" partitions (over 4: {commit[4]:.2f} s)")
    row(f"status, {args.many} partitions", min(status_s), "s", "report.status and its per-topic totals, every"
        " partition behind")
    row(f"console page, {args.many} partitions", min(page_s), "s", "inspection.partitions (positions, offsets,"
        " the oldest unread record of every partition behind)")
    small, big = f"{args.fixed_records:,}", f"{args.scale_records / 1e6:g}M"
    return [
        (f"55 {small} records over {args.many} partitions / over 4 <= 2",
         best["small", args.many]["seconds"] / best["small", 4]["seconds"], 2, "<="),
        (f"55 {big} records over {args.many} partitions / over 4 <= 1.3",
         best["big", args.many]["seconds"] / best["big", 4]["seconds"], 1.3, "<="),
        (f"55 commit of {args.many} ranges - of 4 <= 0.3 s", commit[args.many] - commit[4], 0.3, "<="),
        (f"55 status of {args.many} partitions <= 1 s", min(status_s), 1, "<="),
        (f"55 console page of {args.many} partitions <= 1 s", min(page_s), 1, "<="),
    ]
