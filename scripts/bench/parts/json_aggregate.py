"""The `json` part: the page-view aggregate on JSON at the small and the big size, in both modes, against the
plain consumer's whole process and Spark's readers (targets 1, 2, 3, 6 and 14)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from psycopg2 import sql

from bench.env import CONNECT, MODE, SUBMIT, Env, produce_per_partition, spans
from bench.harness import chart_point, row, worst_round
from bench.peers import flink
from bench.peers.plain import plain_process, project_read, raw_read
from bench.peers.spark import JSON_COLUMNS, SPARK_PEERS, peer_run, peer_targets, warm_up_with_peers
from bench.runs import breakeven, cpu_targets, marginal_rate, read_row, spark_run
from kafka_batch.core import database
from kafka_batch_dev import sample_data


def contributions_size(env: Env, pipeline, records: int) -> None:
    """The per-range contributions a batch leaves (what the replay horizon folds), per million records."""
    [sink] = pipeline.sinks
    table = sql.Identifier("kafka_batch", sink.contributions_name)
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT pg_total_relation_size(%s), count(*) FROM {}").format(table), (table.as_string(cur),))
        size, rows = cur.fetchone()
    conn.close()
    row("contributions table", size / 2**20 / (records / 1e6), "MB/M records",
        f"{rows:,} rows, {size / 2**20:.1f} MB with indexes after {records:,} records (keys x ranges; the replay horizon"
        " folds older ranges into one row per key)", rows=rows)


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The page-view aggregate on JSON at the small and the big size, in both modes, against the plain
    consumer's whole process on the same records (targets 1, 2 and 6); many partitions (target 3)."""
    # A topic of each size, each read whole by both sides.
    topic, small_topic = f"{env.prefix}_topic", f"{env.prefix}_small"
    for name, records in ((topic, args.records), (small_topic, args.small)):
        sample_data.ensure_topic(env.kafka, name, args.partitions)
        started = time.monotonic()
        sample_data.produce_page_views(env.kafka, name, records, seed=1)
        print(f"produced {records:,} records to {name} in {time.monotonic() - started:.1f}s", flush=True)
    many_topic, few_topic = f"{env.prefix}_many", f"{env.prefix}_few"
    sample_data.ensure_topic(env.kafka, many_topic, args.many)
    sample_data.ensure_topic(env.kafka, few_topic, 4)
    produce_per_partition(env.kafka, many_topic, args.many, args.many_records // args.many, seed=2)
    produce_per_partition(env.kafka, few_topic, 4, args.many_records // 4, seed=2)

    # One batch per round of each job: a committed batch is not read again.
    # Each mode's small job runs before its big one (Spark Connect is also warmed up first, warm_up).
    rounds = [{"small": env.pipeline(f"small_{i}", small_topic),
               "big": env.pipeline(f"big_{i}", topic),
               "small, Spark Connect": env.pipeline(f"small_connect_{i}", small_topic, CONNECT),
               "big, Spark Connect": env.pipeline(f"big_connect_{i}", topic, CONNECT)}
              for i in range(args.repeat)]
    rounds = [{label: (pipeline, env.plan(pipeline)) for label, pipeline in jobs.items()} for jobs in rounds]
    big, big_batch = rounds[0]["big"]
    small_ranges = spans(rounds[0]["small"][1].ranges)
    many, few = env.pipeline("many", many_topic), env.pipeline("few", few_topic)
    started = time.monotonic()
    many_batch = env.plan(many)
    plan_s = time.monotonic() - started
    few_batch = env.plan(few)

    print("measuring:", flush=True)
    warm_up_with_peers(env, lambda i: env.pipeline(f"warm_{i}", small_topic, CONNECT), rounds[0]["small"][1].ranges)
    row("planning", plan_s, "s", f"plan_batch over {args.many} partitions")
    runs: dict[str, list[dict]] = defaultdict(list)
    peer_runs: dict[str, list[float]] = defaultdict(list)
    small_name, big_name = f"{args.small / 1e6:g}M", f"{args.records / 1e6:g}M"
    for i, jobs in enumerate(rounds, 1):  # rounds, so that a slow minute of the machine hits every measure alike
        print(f"round {i} of {args.repeat}:", flush=True)
        raw = read_row("raw read", "plain consumer loop", raw_read, env, big_batch.ranges)
        read_row("project reader", "read_partitions + Arrow + JSON fields, one process", project_read, env, big,
                 big_batch.ranges)
        plain_small = plain_process(env, small_ranges, 1, f"plain consumer process, {small_name}")
        plain_big = plain_process(env, spans(big_batch.ranges), 1, f"plain consumer process, {big_name}")
        for label, (pipeline, batch) in jobs.items():
            runs[label].append(spark_run(env, pipeline, batch, label))
        for size, name in (("small", small_name), ("big", big_name)):
            pipeline, batch = jobs[f"{size}, Spark Connect"]
            for peer in SPARK_PEERS:
                seconds = peer_run(env, peer, name, batch.ranges, batch.span, pipeline.sinks[0].table, JSON_COLUMNS)
                peer_runs[f"{peer[0]} {name}, {MODE[peer[2]]}"].append(seconds)
            peer_runs[f"Flink {name}"].append(flink.aggregate_run(env, name, batch.ranges, batch.span,
                                                                  pipeline.sinks[0].table, JSON_COLUMNS))
    # Each job's fastest round; memory: the highest peak of any round.
    small_run, big_run, small_connect_run, big_connect_run = (
        {**min(runs[label], key=lambda r: r["seconds"]),
         "rss": {k: max(r["rss"][k] for r in runs[label]) for k in runs[label][0]["rss"]}}
        for label in ("small", "big", "small, Spark Connect", "big, Spark Connect"))
    contributions_size(env, big, big_run["records"])
    marginal = marginal_rate(small_run, big_run)
    marginal_connect = marginal_rate(small_connect_run, big_connect_run)
    row("spark marginal", marginal, "records/s", "(big - small records) / (big - small seconds)")
    row("spark marginal, Spark Connect", marginal_connect, "records/s", "the same, both jobs via Spark Connect")
    plain_rate = args.records / plain_big["value"]
    row("plain consumer marginal", (args.records - args.small) / (plain_big["value"] - plain_small["value"]),
        "records/s", "the plain consumer's process: (big - small records) / (big - small seconds)")
    fixed_s = small_run["seconds"] - small_run["records"] / marginal
    row("spark-submit 1.5x from", breakeven(fixed_s, marginal, plain_rate, 1.5), "records",
        f"the batch size from which spark-submit reads 1.5x the plain consumer's rate: {fixed_s:.1f} s fixed, then"
        f" {marginal:,.0f} records/s")
    peer_best = {label: min(seconds) for label, seconds in peer_runs.items()}
    for records, connect_run, submit_run, plain in ((args.small, small_connect_run, small_run, plain_small),
                                                    (args.records, big_connect_run, big_run, plain_big)):
        chart_point(f"kafka-batch run, {MODE[CONNECT]}", records, connect_run["seconds"], connect_run["row"])
        chart_point(f"kafka-batch run, {MODE[SUBMIT]}", records, submit_run["seconds"], submit_run["row"])
        chart_point("plain consumer process", records, plain["value"], plain)
    many_run = spark_run(env, many, many_batch, f"{args.many} partitions")
    few_run = spark_run(env, few, few_batch, "4 partitions")
    return [
        # The samples' execution (Spark Connect) first; spark-submit, for clusters without a server, after.
        # Both sides from their command's start, on the same records.
        (f"1 JSON {small_name}: plain consumer / kafka-batch run >= 1.5, Spark Connect",
         plain_small["value"] / small_connect_run["seconds"], 1.5, ">="),
        (f"68 JSON {small_name}: plain consumer / kafka-batch run >= 1.5 in every round (its worst), Spark Connect",
         worst_round([r["seconds"] for r in runs["small, Spark Connect"]], plain_small["samples"]), 1.5, ">="),
        (f"1 JSON {big_name}: the same >= 2, Spark Connect", plain_big["value"] / big_connect_run["seconds"], 2, ">="),
        (f"1 JSON {big_name}: the same >= 1.5, spark-submit", plain_big["value"] / big_run["seconds"], 1.5, ">="),
        *cpu_targets(f"JSON {small_name}", {CONNECT: small_connect_run["row"], SUBMIT: small_run["row"]}, plain_small),
        *cpu_targets(f"JSON {big_name}", {CONNECT: big_connect_run["row"], SUBMIT: big_run["row"]}, plain_big),
        ("2 spark marginal / raw read >= 0.6, Spark Connect", marginal_connect / raw["value"], 0.6, ">="),
        ("2 same, spark-submit", marginal / raw["value"], 0.6, ">="),
        (f"3 {args.many} partitions / 4 partitions wall time <= 2", many_run["seconds"] / few_run["seconds"], 2, "<="),
        ("6 worker peak RSS big / small <= 1.25", big_run["rss"]["worker"] / max(small_run["rss"]["worker"], 1), 1.25,
         "<="),
        *peer_targets(14, small_name, {MODE[CONNECT]: small_connect_run["seconds"],
                                       MODE[SUBMIT]: small_run["seconds"]}, peer_best, "JSON"),
        *peer_targets(14, big_name, {MODE[CONNECT]: big_connect_run["seconds"],
                                     MODE[SUBMIT]: big_run["seconds"]}, peer_best, "JSON"),
        *flink_targets(small_name, small_connect_run, small_run, peer_best),
        *flink_targets(big_name, big_connect_run, big_run, peer_best),
    ]


def flink_targets(size: str, connect_run: dict, submit_run: dict, peer_best: dict[str, float]) -> list[tuple]:
    """Issue 68's: the pipeline at least 1.2x Flink's bounded job at each size, Spark Connect; spark-submit
    against it reported (both start a JVM per batch)."""
    row(f"JSON {size}: Flink / kafka-batch run, spark-submit", peer_best[f"Flink {size}"] / submit_run["seconds"],
        "x", "Flink's whole process (its MiniCluster) against spark-submit's, both from the command's start")
    return [(f"68 JSON {size}: kafka-batch run / Flink >= 1.2, {MODE[CONNECT]}",
             peer_best[f"Flink {size}"] / connect_run["seconds"], 1.2, ">=")]
