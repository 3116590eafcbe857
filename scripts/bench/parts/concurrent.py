"""The `concurrent` part: many pipelines at once on one Spark Connect server and one Postgres (target 55)."""

from __future__ import annotations

import argparse
import subprocess
import time

from bench.checks import topic_totals
from bench.env import CONNECT, KAFKA_BATCH, Env
from bench.harness import row, settle
from bench.runs import cli_run, warm_up
from kafka_batch.core import database
from kafka_batch_dev import sample_data


def started_together(pipelines: list) -> tuple[float, list[float]]:
    """`kafka-batch run` of every pipeline at once: (seconds until the last ends, each one's seconds)."""
    started = time.monotonic()
    running = {subprocess.Popen([KAFKA_BATCH, "run", "--pipeline", p.name], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True): p for p in pipelines}
    took = {}
    while running:
        for proc in [proc for proc in running if proc.poll() is not None]:
            took[running.pop(proc).name] = time.monotonic() - started
            if proc.returncode != 0:
                raise RuntimeError(f"kafka-batch run failed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    return time.monotonic() - started, [took[p.name] for p in pipelines]


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """Issue 55's many batches at once, on one Spark Connect server and one Postgres: --concurrent (20)
    pipelines, two reading each topic, started together in --repeat rounds (records added before each),
    against as many others over the same topics run one after another in the same rounds. Every table is
    then checked against a plain read_committed consumer's totals of its topic."""
    n = args.concurrent
    topics = [f"{env.prefix}_conc_{t}" for t in range(max(1, n // 2))]
    for topic in topics:
        sample_data.ensure_topic(env.kafka, topic, 4)
    together = [env.pipeline(f"conc_{i}", topics[i % len(topics)], CONNECT) for i in range(n)]
    alone = [env.pipeline(f"conc_serial_{i}", topics[i % len(topics)], CONNECT) for i in range(n)]
    warm_up(env, lambda i: env.pipeline(f"conc_warm_{i}", topics[0], CONNECT), batches=4)
    ratios = []
    for r in range(args.repeat):
        for t, topic in enumerate(topics):
            sample_data.produce_page_views(env.kafka, topic, args.concurrent_records, seed=100 * r + t)
        settle()
        wall, each = started_together(together)
        row(f"{n} pipelines at once", wall, "s", f"{n} batches of {args.concurrent_records:,} records started"
            f" together on one Spark Connect server; each took {min(each):.1f}-{max(each):.1f} s", each=each)
        settle()
        started = time.monotonic()
        for pipeline in alone:
            cli_run(pipeline)
        serial = row(f"{n} pipelines one after another", time.monotonic() - started, "s",
                     "the same batches, one `kafka-batch run` at a time")["samples"][-1]
        ratios.append(wall / serial)
    truth = {topic: topic_totals(env, topic) for topic in topics}
    conn = database.connect(env.postgres)
    wrong = []
    with conn, conn.cursor() as cur:
        for pipeline in together + alone:
            cur.execute(f'SELECT page, minute, views, total_duration_ms FROM "{pipeline.tables[0]}"')
            if {(page, minute): (v, d) for page, minute, v, d in cur.fetchall()} != truth[pipeline.topics[0]]:
                wrong.append(pipeline.name)
    conn.close()
    if wrong:
        raise RuntimeError(f"not exact against the topic's own totals: {wrong}")
    print(f"  all {2 * n} tables equal their topic's totals (a plain read_committed consumer's)", flush=True)
    return [(f"55 {n} pipelines at once / one after another <= 1.3", min(ratios), 1.3, "<=")]
