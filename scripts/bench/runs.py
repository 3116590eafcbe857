"""A batch run as users run it, `kafka-batch run` from the command's start, with its phases and the CPU and
memory of its processes; warm-ups, single-process reads, and the ratios built from runs."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.env import CONNECT, KAFKA_BATCH, MODE, SUBMIT, Env
from bench.harness import CHILD_TIMEOUT_S, load, row, settle
from bench.sampling import ProcessSampler, own_cpu, phases
from kafka_batch.core import batches, database
from kafka_batch.observability import timings
from kafka_batch.spark import jvm_archive
from kafka_batch.spark.submit import spark_environment

IDLE_S = 65  # Spark kills a Python worker idle for a minute
# Batches a part runs through Spark Connect before it measures, unmeasured. A server session compiles
# its generated code, and the JVM's JIT compiles the hot paths, over its first batches: on a fresh
# server the JVM's CPU for the same 1M-record batch was 11 s in its first batch, 2.0-2.2 s in the next
# two, 1.4-1.7 s in the three after, and 0.95-1.16 s from the seventh. A long-lived server (the issue's
# "warmed Spark Connect server") has run many.
WARM_UP_BATCHES = 8


def read_row(name: str, what: str, read, *args) -> dict:
    """The row of one single-process read: records/s, with its CPU time (all its threads, librdkafka's
    too), in a fresh process started from a nearly idle machine. Run here instead, the reads took up to
    twice the CPU after the first Spark jobs: this process then holds Spark Connect's and Airflow's
    clients."""
    settle()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        n, s, cpu = pool.apply(_timed_here, (read, *args))
    return row(name, n / s, "records/s", f"{n:,} records in {s:.1f}s ({what})", cpu=cpu, records=n)


def _timed_here(read, *args) -> tuple[int, float, float]:
    started, cpu = time.monotonic(), time.process_time()
    count = read(*args)
    return count, time.monotonic() - started, time.process_time() - cpu


def cli_run(pipeline, run_id: str | None = None, env: dict[str, str] | None = None) -> tuple[float, dict[str, float]]:
    """`kafka-batch run` of the pipeline (the batch of `run_id`, else its next one), timed from the command's
    start as a user sees it: (seconds, its phases from the timings marks); `env` over the environment."""
    marks = Path(tempfile.mkstemp(prefix="kafka_batch_timings_")[1])
    command = [KAFKA_BATCH, "run", "--pipeline", pipeline.name, *(["--run-id", run_id] if run_id else [])]
    started_wall, started = time.time(), time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, **(env or {}), timings.ENV: str(marks)}, timeout=CHILD_TIMEOUT_S)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"kafka-batch {' '.join(command[1:])} failed: {result.stderr[-2000:]}")
    breakdown = phases(timings.read(str(marks)), spawned=started_wall, ended=time.time())
    marks.unlink()
    return seconds, breakdown


def spark_run(env: Env, pipeline, batch, label: str, records: int | None = None) -> dict:
    """One planned batch through `kafka-batch run --run-id` (cli_run); `records`: what it must read where
    markers take offsets (default: every offset of its ranges is a record)."""
    records = batch.span if records is None else records
    settle()  # timed from a nearly idle machine
    with ProcessSampler(pipeline.connections.spark == CONNECT) as sampled:
        seconds, breakdown = cli_run(pipeline, batch.run_id)
    conn = database.connect(env.postgres)
    committed = batches.load_batch(conn, batch.id)
    with conn.cursor() as cur:
        cur.execute("SELECT read_tasks, records_tombstone FROM kafka_batch.batches WHERE id = %s", (batch.id,))
        [(read_tasks, tombstones)] = cur.fetchall()
    conn.close()
    assert committed.status == "committed" and committed.records_read + tombstones == records, (committed, records)
    mb = {k: round(v / 2**20) for k, v in sampled.peaks.items()}
    cpu = sampled.cpu_seconds()
    measured = row(f"spark job {label}", records / seconds, "records/s",
                   f"{records:,} records, {len(batch.ranges)} ranges, {read_tasks} read tasks in {seconds:.1f}s"
                   f" (kafka-batch run); peak RSS MB {mb}; CPU s by process {cpu}; phases {breakdown}",
                   own_cpu(cpu), records, seconds=round(seconds, 2), rss_mb=mb, cpu_by_process=cpu, phases=breakdown,
                   read_tasks=read_tasks)
    return {"seconds": seconds, "records": records, "rss": mb, "phases": breakdown, "row": measured}


def warm_up(env: Env, make_pipeline, batches: int = WARM_UP_BATCHES, between=None) -> None:
    """Run `batches` batches of pipelines made by `make_pipeline(i)` through Spark Connect, unmeasured (see
    WARM_UP_BATCHES); each reads its topic from the start. `between(i)`: what else runs on the server after
    batch i (the Spark peers' warm-up, peers.spark.warm_up_with_peers)."""
    started = time.monotonic()
    for i in range(batches):
        pipeline = make_pipeline(i)
        cli_run(pipeline, env.plan(pipeline).run_id)
        if between is not None:
            between(i)
    peers = "" if between is None else ", each followed by the peers' runs"
    print(f"  warm-up: {batches} batches via Spark Connect{peers}, not measured, in {time.monotonic() - started:.1f} s"
          f" (load {load()})", flush=True)


def marginal_rate(small: dict, big: dict) -> float:
    """Records/s of the records the big job reads beyond the small one: the rate without the fixed cost.
    NaN (no target passes on it) when the big job was not slower, e.g. the small one was a fresh Spark
    Connect server's first job."""
    extra = big["seconds"] - small["seconds"]
    return (big["records"] - small["records"]) / extra if extra > 0 else float("nan")


def breakeven(fixed_s: float, rate: float, baseline_rate: float, ratio: float) -> float:
    """Records per batch from which a job of `fixed_s` seconds plus `rate` records/s is `ratio` x as fast
    as the baseline (inf: never)."""
    gain = 1 / baseline_rate - ratio / rate if rate > 0 else 0
    return ratio * fixed_s / gain if gain > 0 else float("inf")


def side_by_side(repeat: int, planned: list[tuple], baseline_round, env: Env) -> tuple[dict, dict[str, float]]:
    """Rounds of a plain consumer (`baseline_round(i)`, its row) and the planned jobs (two per round: one per
    execution mode); the consumer's best row and each job's best seconds."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for i in range(repeat):
        base = baseline_round(i)
        for label, pipeline, batch in planned[2 * i:2 * i + 2]:
            runs[label].append(spark_run(env, pipeline, batch, label))
    return base, {label: min(r["seconds"] for r in rs) for label, rs in runs.items()}


def mode_targets(number: int, what: str, records: int, base: dict, best: dict[str, float]) -> list[tuple]:
    """The ratio targets of a job against its plain consumer, the samples' mode (Spark Connect) first."""
    return [(f"{number} {what} / plain consumer >= 1.5, {MODE[CONNECT]}", records / best[f"{what}, {MODE[CONNECT]}"]
             / base["value"], 1.5, ">="),
            (f"{number} same, {MODE[SUBMIT]}", records / best[f"{what}, {MODE[SUBMIT]}"] / base["value"], 1.5, ">=")]


def jvm_archive_state() -> str:
    """Whether this spark-submit maps the driver JVM's class archive, or writes it (a slower run)."""
    path = jvm_archive.archive_path(spark_environment())
    return "off" if path is None else "mapped" if path.exists() else "written by this run"


def cpu_targets(case: str, pipeline: dict[str, dict], plain: dict) -> list[tuple]:
    """Issue 68's target: the pipeline's CPU per record (its command's and the Spark Connect server's, the
    least of its rounds; `pipeline`: its rows by Spark connection) at most the plain consumer's on the same
    records (`plain`, its row: for JSON its whole process'; the Avro one reads in a fresh process whose
    interpreter's start is not counted), Spark Connect first."""
    return [(f"68 {case}: CPU per record, kafka-batch run / plain consumer <= 1.0, {MODE[spark]}",
             measured["cpu_least"] / plain["cpu_least"], 1.0, "<=")
            for spark in (CONNECT, SUBMIT) if (measured := pipeline.get(spark))]
