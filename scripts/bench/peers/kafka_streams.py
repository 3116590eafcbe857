"""Kafka Streams (kafka_batch_peers/PageViewStreams.java, exactly_once_v2) beside the Kafka sink, checked to
publish the pipeline's messages before its time counts."""

from __future__ import annotations

import os
import subprocess
import time

from bench.checks import published
from bench.env import Env, topic_partitions
from bench.harness import CHILD_TIMEOUT_S, row, settle
from bench.peers import launch as peer_launch
from bench.sampling import ProcessSampler, own_cpu
from kafka_batch.spark.submit import spark_environment
from kafka_batch_dev import local_stack, sample_data


def streams_run(env: Env, topic: str, expected: str, records: int, n: int) -> float:
    """The Kafka Streams application (exactly_once_v2) over `topic` into a new topic, its whole process
    timed; its messages must be the pipeline's (in `expected`). Its seconds."""
    output = f"{expected}_streams"
    partitions = topic_partitions(env, topic)
    sample_data.ensure_topic(env.kafka, output, partitions)
    command = peer_launch.streams_command(local_stack.home(), env.kafka, topic, output, f"{env.prefix}_streams_{n}",
                                          min(partitions, os.cpu_count() or 2))
    settle()  # timed from a nearly idle machine
    with ProcessSampler(connect=False) as sampled:
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **spark_environment()},
                                timeout=CHILD_TIMEOUT_S)
        seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"Kafka Streams failed (exit {result.returncode}): {result.stderr[-3000:]}")
    if published(env, output) != published(env, expected):
        raise RuntimeError(f"Kafka Streams' {output} does not hold the pipeline's messages ({expected})")
    cpu = sampled.cpu_seconds()
    row("Kafka Streams, rows to a topic", records / seconds, "records/s", f"{records:,} records in {seconds:.1f}s,"
        f" its whole process (exactly_once_v2); its messages are the pipeline's; CPU s by process {cpu}", own_cpu(cpu),
        records, seconds=round(seconds, 2), cpu_by_process=cpu)
    return seconds
