"""The `curve` part: the chart's smaller batch sizes, every system at each."""

from __future__ import annotations

import argparse

from bench.env import CONNECT, MODE, SUBMIT, Env, spans
from bench.harness import chart_point
from bench.peers import flink
from bench.peers.plain import plain_process
from bench.peers.spark import JSON_COLUMNS, SPARK_PEERS, peer_run, warm_up_with_peers
from bench.runs import spark_run
from kafka_batch_dev import sample_data


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The chart's smaller batches (--curve sizes; the json part adds the small and the big size): at each,
    the pipeline in both modes, every Spark peer, Flink and the plain consumer's whole process on the same records
    (JSON page views, --partitions partitions, a topic per size), Spark Connect warmed up first."""
    sizes = [int(n) for n in args.curve.split(",")]
    topics = {}
    for records in sizes:
        topics[records] = f"{env.prefix}_curve_{records}"
        sample_data.ensure_topic(env.kafka, topics[records], args.partitions)
        sample_data.produce_page_views(env.kafka, topics[records], records, seed=15)
    warm_up_with_peers(env, lambda i: env.pipeline(f"curve_warm_{i}", topics[sizes[-1]], CONNECT),
                       env.plan(env.pipeline("curve_peer_warm", topics[sizes[-1]])).ranges)
    for i in range(args.repeat):
        for records in sizes:
            size = f"{records:,}"
            jobs = {spark: env.pipeline(f"curve_{records}_{i}_{spark}", topics[records], spark) for spark in (CONNECT, SUBMIT)}
            planned = {spark: env.plan(pipeline) for spark, pipeline in jobs.items()}
            for spark, pipeline in jobs.items():
                run = spark_run(env, pipeline, planned[spark], f"curve {size}, {MODE[spark]}")
                chart_point(f"kafka-batch run, {MODE[spark]}", records, run["seconds"], run["row"])
            batch = planned[CONNECT]
            for peer in SPARK_PEERS:
                peer_run(env, peer, size, batch.ranges, batch.span, jobs[CONNECT].sinks[0].table, JSON_COLUMNS)
            flink.aggregate_run(env, size, batch.ranges, batch.span, jobs[CONNECT].sinks[0].table, JSON_COLUMNS)
            plain = plain_process(env, spans(batch.ranges), 1, f"plain consumer process, {size}")
            chart_point("plain consumer process", records, plain["value"], plain)
    return []
