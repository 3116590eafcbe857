"""Spark's own ways to read a batch (spark_peer.py), run beside the pipeline on the same topics, Spark and
Postgres, each checked to give the pipeline's rows before its time counts."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid

from bench.checks import check_same_rows
from bench.env import CONNECT, MODE, SUBMIT, Env, spans
from bench.harness import CHILD_TIMEOUT_S, chart_point, row, settle
from bench.peers import launch as peer_launch
from bench.runs import WARM_UP_BATCHES, warm_up
from bench.sampling import ProcessSampler, own_cpu
from kafka_batch_dev import local_stack

# Spark's own ways to read a batch, run beside the pipeline on the same topics, Spark and Postgres
# (scripts/bench/peers/spark_peer.py): (name, spark_peer mode, where it runs). KafkaRDD has no Spark Connect API.
JSON_COLUMNS = ["page", "minute", "views", "total_duration_ms"]  # the JSON aggregate's table, compared


AVRO_COLUMNS = ["page", "country", "minute", "views", "total_duration_ms"]  # the Avro sample's


SPARK_PEERS = (("Spark batch source", "batch", CONNECT), ("Spark batch source", "batch", SUBMIT),
               ("AvailableNow stream", "available-now", CONNECT), ("KafkaRDD", "rdd", SUBMIT))


def peer_run(env: Env, peer: tuple[str, str, str], size: str, ranges, records: int, expected: str | None,
             columns: list[str], **options: str) -> float:
    """One run of a Spark peer over the ranges (or, streaming, their topic from their start), timed from its
    command's start as `kafka-batch run` is; its table must hold exactly the pipeline's rows (`expected`,
    compared on `columns`) and it must have read `records`, or the bench stops: a peer's time counts only
    for the same result. Its seconds. `expected` None: a warm-up run, neither checked nor recorded."""
    name, mode, spark = peer
    label = f"{name} {size}, {MODE[spark]}"
    table = f"{env.prefix}_peer_{uuid.uuid4().hex[:8]}"
    env.tables += [("public", t) for t in (table, f"{table}_offsets", f"{table}_batches")]
    checkpoint = tempfile.mkdtemp(prefix="kafka_batch_checkpoint_") if mode == "available-now" else None
    command, environment = peer_launch.spark_peer_command(
        local_stack.home(), mode, env.spark_connect if spark == CONNECT else None, env.kafka, env.postgres,
        spans(ranges), table, **options, **({"checkpoint": checkpoint} if checkpoint else {}))
    if expected:
        settle()  # timed from a nearly idle machine
    with ProcessSampler(connect=spark == CONNECT) as sampled:
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **environment},
                                timeout=CHILD_TIMEOUT_S)
        seconds = time.monotonic() - started
    if checkpoint:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"{label} failed (exit {result.returncode}): {result.stderr[-3000:]}")
    if expected is None:
        return seconds
    check_same_rows(env, label, int(result.stdout.split()[-1]), records, expected, table, columns)
    cpu = sampled.cpu_seconds()
    measured = row(label, records / seconds, "records/s", f"{records:,} records in {seconds:.1f}s, whole process"
                   f" (spark_peer.py --mode {mode}); its rows are the pipeline's; CPU s by process {cpu}", own_cpu(cpu),
                   records, seconds=round(seconds, 2), cpu_by_process=cpu)
    if "format" not in options:  # the chart is of the JSON aggregate
        chart_point(f"{name}, {MODE[spark]}", records, seconds, measured)
    return seconds


def warm_up_with_peers(env: Env, make_pipeline, ranges, batches: int = WARM_UP_BATCHES, **options: str) -> None:
    """Warm the Spark Connect server up as a long-lived one is, by both sides of the measures, unmeasured: the
    pipeline's batches (`make_pipeline(i)`, runs.warm_up), each followed by one run of each Spark peer of the
    server over `ranges`. Warmed up one after the other instead, the pipeline's first measured batch recompiled
    what the peers' runs had changed in the JVM (the server's CPU 1.9 s against 0.9 s in the next batch), and
    the first of three rounds was the slowest in every part."""
    def peers(_batch: int) -> None:
        for peer in SPARK_PEERS:
            if peer[2] == CONNECT:
                peer_run(env, peer, "warm-up", ranges, 0, None, [], **options)

    warm_up(env, make_pipeline, batches, between=peers)


def peer_targets(number: int, case: str, pipeline_s: dict[str, float], peer_s: dict[str, float],
                 what: str = "") -> list:
    """The pipeline on Spark Connect against each Spark peer of `case` (the size in the peers' labels, e.g.
    "1M" or "Avro 1M"; `what` names it where the label does not): never slower than Spark's batch source on
    the same server, 1.2x the AvailableNow stream and the KafkaRDD job; spark-submit against the batch
    source through spark-submit, reported."""
    def ratio(peer: str, spark: str, ours: str = CONNECT) -> float:
        return peer_s[f"{peer} {case}, {MODE[spark]}"] / pipeline_s[MODE[ours]]

    name = f"{what} {case}".strip()
    if MODE[SUBMIT] in pipeline_s:
        row(f"{name}: Spark batch source / kafka-batch run, spark-submit", ratio("Spark batch source", SUBMIT,
            SUBMIT), "x", "the batch source's spark-submit against the pipeline's, both from the command's start")
    return [(f"{number} {name}: kafka-batch run / Spark batch source >= 1.0, {MODE[CONNECT]}",
             ratio("Spark batch source", CONNECT), 1.0, ">="),
            (f"{number} same / AvailableNow stream >= 1.2, {MODE[CONNECT]}", ratio("AvailableNow stream", CONNECT),
             1.2, ">="),
            (f"{number} same / KafkaRDD (spark-submit) >= 1.2", ratio("KafkaRDD", SUBMIT), 1.2, ">=")]
