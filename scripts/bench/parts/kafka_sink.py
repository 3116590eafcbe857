"""The `kafka-sink` part: rows published to a topic against the plain exactly-once publisher and Kafka
Streams, and the driver's memory at 10M records (targets 13 and 55)."""

from __future__ import annotations

import argparse
import time

from bench.checks import published
from bench.env import Env
from bench.harness import row
from bench.peers import flink
from bench.peers.kafka_streams import streams_run
from bench.peers.plain import plain_publisher_run
from bench.runs import spark_run, warm_up
from kafka_batch.core import database
from kafka_batch_dev import sample_data


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The small size's records through a pipeline whose one sink publishes each record to a topic (Spark
    Connect), against the plain exactly-once publisher (scripts/bench/peers/plain_publisher.py: Kafka's own
    consume-transform-produce, a transaction with the offsets every 10,000 records) over the same ranges,
    its whole process, each side making the same messages: the sink as configured by default (five lineage
    headers a message) against the loop adding the same headers, and the sink with `headers: []` against
    the loop as it is (target 13, both)."""
    topic = f"{env.prefix}_publish"
    sample_data.ensure_topic(env.kafka, topic, args.partitions)
    sample_data.produce_page_views(env.kafka, topic, args.small, seed=5)
    # The server's JVM compiles the sink's paths (its projection to JSON, the result streamed to the
    # driver) over its first batches, as it does the aggregate's (WARM_UP_BATCHES): a fifth of the records.
    warm, warm_output = f"{env.prefix}_publish_warm", f"{env.prefix}_publish_warm_out"
    for name in (warm, warm_output):
        sample_data.ensure_topic(env.kafka, name, args.partitions)
    sample_data.produce_page_views(env.kafka, warm, args.small // 5, seed=7)
    warm_up(env, lambda i: env.publishing_pipeline(f"publish_warm_{i}", warm, warm_output))
    plain_s, lineage_s, sink_runs, bare_s, streams_s, flink_s = [], [], [], [], [], []
    for n in range(args.repeat):
        output = f"{env.prefix}_publish_out_{n}"
        pipeline = env.publishing_pipeline(f"publish_{n}", topic, output)
        batch = env.plan(pipeline)
        lineage_s.append(plain_publisher_run(env, batch, f"{output}_plain_lineage", f"{pipeline.name}:{batch.id}"))
        sample_data.ensure_topic(env.kafka, output, args.partitions)
        sink_runs.append(spark_run(env, pipeline, batch, "rows to a topic, Spark Connect"))
        if n == 0 and published(env, output, headers=True) != published(env, f"{output}_plain_lineage", headers=True):
            raise RuntimeError(f"the sink ({output}) and the plain publisher with its headers hold different messages")
        bare_output = f"{output}_bare"
        bare = env.publishing_pipeline(f"publish_bare_{n}", topic, bare_output, headers=[])
        bare_batch = env.plan(bare)
        plain_s.append(plain_publisher_run(env, bare_batch, f"{output}_plain"))
        sample_data.ensure_topic(env.kafka, bare_output, args.partitions)
        bare_s.append(spark_run(env, bare, bare_batch, "rows to a topic without headers, Spark Connect")["seconds"])
        if n == 0 and published(env, bare_output) != published(env, f"{output}_plain"):
            raise RuntimeError(f"the sink without headers ({bare_output}) does not hold the plain publisher's messages")
        streams_s.append(streams_run(env, topic, bare_output, batch.span, n))
        flink_s.append(flink.publish_run(env, topic, bare_batch.ranges, bare_output, bare_batch.span))
    sink_s = [run["seconds"] for run in sink_runs]
    row("Kafka Streams / kafka-batch run, rows to a topic", min(streams_s) / min(bare_s), "x",
        "the Kafka Streams application's whole process against the pipeline's Kafka sink without headers (the same"
        " messages), from each command's start")
    row("Kafka sink with its lineage headers / plain publisher without, rows to a topic", min(plain_s) / min(sink_s),
        "x", "not the same messages: what the headers cost against the loop as it is")
    big = publish_big(args, env)
    driver = min(run["rss"]["driver"] for run in sink_runs)
    size = f"{args.small / 1e6:g}M"
    return [(f"13 rows to a topic, {size}, lineage headers: Kafka sink / plain publisher with them >= 1.5",
             min(lineage_s) / min(sink_s), 1.5, ">="),
            (f"13 rows to a topic, {size}, no headers: Kafka sink / plain publisher >= 1.5",
             min(plain_s) / min(bare_s), 1.5, ">="),
            (f"68 rows to a topic, {size}: Kafka sink without headers / Flink KafkaSink >= 1.0",
             min(flink_s) / min(bare_s), 1.0, ">="),
            (f"55 driver peak RSS, rows to a topic, {args.publish_big / 1e6:g}M / {size} <= 1.25",
             big["rss"]["driver"] / driver, 1.25, "<=")]


def publish_big(args: argparse.Namespace, env: Env) -> dict:
    """One batch of --publish-big records (10M) through the Kafka sink, for the driver's peak memory (the
    messages stream through it: it holds a few pieces, whatever the batch's size) and the rate at that
    size; the ledger must say it published every record."""
    topic, output = f"{env.prefix}_publish_big", f"{env.prefix}_publish_big_out"
    for name in (topic, output):
        sample_data.ensure_topic(env.kafka, name, args.partitions)
    started = time.monotonic()
    sample_data.produce_page_views(env.kafka, topic, args.publish_big, seed=6)
    print(f"produced {args.publish_big:,} records to {topic} in {time.monotonic() - started:.1f}s", flush=True)
    # Tasks of 250k records: the server holds a task per core ahead for the driver (docs/sinks/kafka.md
    # sizes them to its memory: 1 GB here); the small size's batch, of two tasks, runs with the defaults.
    pipeline = env.publishing_pipeline("publish_big", topic, output, limits={"max_records_per_task": 250_000})
    batch = env.plan(pipeline)
    result = spark_run(env, pipeline, batch, f"rows to a topic, {args.publish_big / 1e6:g}M, Spark Connect")
    conn = database.connect(env.postgres)
    with conn.cursor() as cur:
        cur.execute("SELECT (published -> %s ->> 'messages')::bigint FROM kafka_batch.batches WHERE id = %s",
                    (output, batch.id))
        [(messages,)] = cur.fetchall()
    conn.close()
    if messages != batch.span:
        raise RuntimeError(f"the {args.publish_big:,}-record batch published {messages} messages, not {batch.span:,}")
    return result
