"""The `fixed` part: what a small batch costs from the command's start (targets 4 and 11)."""

from __future__ import annotations

import argparse
import time

from bench.env import CONNECT, MODE, SUBMIT, Env
from bench.harness import row, settle
from bench.peers.plain import plain_process
from bench.runs import IDLE_S, cli_run, jvm_archive_state
from kafka_batch_dev import sample_data


def fixed_cost(env: Env, records: int, spark: str, rounds: int = 1, after_idle_s: float = 0) -> list[dict]:
    """`kafka-batch run` of a `records` batch, timed from the command's start (the best of `rounds`, each
    over `records` new records). On Spark Connect it is
    the pipeline's second batch: a new package's first batch also starts the server session's Python
    workers, once per deployment, and an everyday batch finds them warm. `after_idle_s`: then once more
    after that long idle: Spark kills a Python worker idle for a minute, so a batch every few minutes
    starts on fresh workers (forked from the server's daemon, kafka_batch_daemon.preloaded)."""
    name = f"fixed_{spark}"  # a topic and a pipeline of its own for each mode
    topic = f"{env.prefix}_{name}"
    sample_data.ensure_topic(env.kafka, topic, 1)
    pipeline = env.pipeline(name, topic, spark)
    if spark == CONNECT:
        sample_data.produce_page_views(env.kafka, topic, records, seed=4)
        cli_run(pipeline)
    archive = jvm_archive_state() if spark == SUBMIT else "not used"

    def timed(label: str, idle_s: float = 0) -> dict:
        sample_data.produce_page_views(env.kafka, topic, records, seed=5)
        settle()  # timed from a nearly idle machine
        time.sleep(idle_s)
        seconds, breakdown = cli_run(pipeline)
        return row(label, seconds, "s", f"kafka-batch run of {records:,} records; JVM class archive {archive};"
                   f" phases {breakdown}", phases=breakdown, jvm_class_archive=archive)

    for _ in range(rounds):
        warm = timed(f"fixed cost, {MODE[spark]}")  # its row keeps the best round
    measured = [warm]
    if after_idle_s:
        measured.append(timed(f"fixed cost after {after_idle_s:.0f} s idle, {MODE[spark]}", after_idle_s))
    return measured


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The fixed cost of a small batch from the command's start (targets 4 and 11)."""
    [fixed] = fixed_cost(env, args.fixed_records, SUBMIT, args.repeat)
    fixed_connect, _after_idle = fixed_cost(env, args.fixed_records, CONNECT, args.repeat, after_idle_s=IDLE_S)
    plain = plain_process(env, [(f"{env.prefix}_fixed_{CONNECT}", 0, args.fixed_records, 2 * args.fixed_records)],
                          name="plain consumer process, fixed cost's records")
    return [
        ("4 fixed cost (s) <= 10 (idle machine), Spark Connect", fixed_connect["value"], 10, "<="),
        ("4 same, spark-submit", fixed["value"], 10, "<="),
        ("68 fixed cost (s) <= 5, spark-submit", fixed["value"], 5, "<="),
        ("11 fixed cost / plain consumer's process <= 7, Spark Connect", fixed_connect["value"] / plain["value"], 7,
         "<="),
    ]
