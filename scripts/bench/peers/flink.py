"""Apache Flink (kafka_batch_peers/FlinkPageViews.java) beside the aggregate and the Kafka sink: a bounded
KafkaSource over the batch's ranges into Postgres through Flink's JDBC sink in exactly-once (XA) mode, and
into a topic through KafkaSink in EXACTLY_ONCE; each checked to give the pipeline's rows or messages before
its time counts."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from bench.checks import check_same_rows, published
from bench.env import Env, spans, topic_partitions
from bench.harness import chart_point, row, settle
from bench.peers import launch as peer_launch
from bench.sampling import ProcessSampler, own_cpu
from kafka_batch.core import database
from kafka_batch.spark.submit import spark_environment
from kafka_batch_dev import local_stack, sample_data

SYSTEM = "Flink, MiniCluster"  # the chart's name for it
# A run takes 5-20 s; one that does not end (once, 3M records in a round of 2026-11-29, then 30 minutes) is
# stopped long before, with its output's end in the error.
RUN_TIMEOUT_S = 300


def _run(env: Env, mode: str, ranges, target: str, label: str) -> tuple[float, dict]:
    """One run of the Flink job, its whole process timed from a nearly idle machine: (seconds, its CPU by
    process). A failed run raises with its output's end, and its prepared transactions (left by a job
    that failed between prepare and commit) are rolled back, so that nothing waits on their locks."""
    command = peer_launch.flink_command(local_stack.home(), mode, env.kafka, f"{env.prefix}_flink_{uuid.uuid4().hex[:8]}",
                                        spans(ranges), target, env.postgres if mode == "aggregate" else None)
    settle()  # timed from a nearly idle machine
    with ProcessSampler(connect=False) as sampled:
        started = time.monotonic()
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                                    env={**os.environ, **spark_environment()})
            failure = None if result.returncode == 0 else f"failed (exit {result.returncode})"
            output = result.stdout + result.stderr
        except subprocess.TimeoutExpired as exc:
            failure, output = f"did not end within {RUN_TIMEOUT_S} s", _text(exc.stdout) + _text(exc.stderr)
        seconds = time.monotonic() - started
    if failure is not None:
        _roll_back_prepared(env)
        raise RuntimeError(f"{label} {failure}: {output[-3000:]}")
    return seconds, sampled.cpu_seconds()


def _text(output: bytes | str | None) -> str:
    """A timed-out run's captured output (bytes, whatever `text` asked for)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _roll_back_prepared(env: Env) -> None:
    conn = database.connect(env.postgres)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        for (gid,) in cur.fetchall():
            cur.execute("ROLLBACK PREPARED %s", (gid,))
    conn.close()


def aggregate_run(env: Env, size: str, ranges, records: int, expected: str, columns: list[str]) -> float:
    """The aggregate into a new table; it must hold exactly the pipeline's rows (`expected`, compared on
    `columns`) and the job must have read `records`. Its seconds."""
    table = f"{env.prefix}_flink_{uuid.uuid4().hex[:8]}"
    env.tables.append(("public", table))
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute("SHOW max_prepared_transactions")
        if int(cur.fetchone()[0]) == 0:
            raise RuntimeError("Postgres allows no prepared transactions, which Flink's JDBC sink needs in XA mode"
                               " (max_prepared_transactions is 0): a local Postgres started by an earlier version"
                               " keeps that until `make down`; `make bench` then starts it with 20")
        cur.execute(f"CREATE TABLE {table} (page text, minute timestamptz, views bigint, total_duration_ms bigint,"
                    " PRIMARY KEY (page, minute))")
    conn.close()
    label = f"Flink {size}, MiniCluster"
    try:
        seconds, cpu = _run(env, "aggregate", ranges, table, label)
    except RuntimeError as failed:  # the job runs without restarts (FlinkPageViews): once more, from the start
        print(f"  {failed}; running it once more into the emptied table", flush=True)
        conn = database.connect(env.postgres)
        with conn, conn.cursor() as cur:
            cur.execute(f"TRUNCATE {table}")
        conn.close()
        seconds, cpu = _run(env, "aggregate", ranges, table, label)
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:  # each record read is one view
        cur.execute(f"SELECT coalesce(sum(views), 0) FROM {table}")
        (read,) = cur.fetchone()
    conn.close()
    check_same_rows(env, label, int(read), records, expected, table, columns)
    measured = row(label, records / seconds, "records/s", f"{records:,} records in {seconds:.1f}s, whole process"
                   " (a bounded KafkaSource, the JDBC sink in XA mode); its rows are the pipeline's; CPU s by process"
                   f" {cpu}", own_cpu(cpu), records, seconds=round(seconds, 2), cpu_by_process=cpu)
    chart_point(SYSTEM, records, seconds, measured)
    return seconds


def publish_run(env: Env, topic: str, ranges, expected: str, records: int) -> float:
    """The page views of `ranges` published to a new topic through KafkaSink in EXACTLY_ONCE; its messages
    must be the pipeline's (in `expected`). Its seconds."""
    output = f"{expected}_flink"
    sample_data.ensure_topic(env.kafka, output, topic_partitions(env, topic))
    label = "Flink KafkaSink, rows to a topic"
    seconds, cpu = _run(env, "publish", ranges, output, label)
    messages = published(env, output)
    if sum(messages.values()) != records or messages != published(env, expected):
        raise RuntimeError(f"{label}: {sum(messages.values()):,} messages for {records:,} records, or its {output}"
                           f" does not hold the pipeline's messages ({expected})")
    row(label, records / seconds, "records/s", f"{records:,} records in {seconds:.1f}s, its whole process"
        f" (EXACTLY_ONCE); its messages are the pipeline's; CPU s by process {cpu}", own_cpu(cpu), records,
        seconds=round(seconds, 2), cpu_by_process=cpu)
    return seconds
