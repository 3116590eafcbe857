"""`make bench`: the project against a hand-written consumer, side by side on the same topic data.

Every batch runs as a user runs it, `kafka-batch run`, timed from the command's start. One run
produces the data, plans every batch, then measures (each with the load average then):
  raw read        a plain confluent-kafka loop over the big batch's ranges, one process, no parsing
  project reader  kafka_source.read_partitions + Arrow columns + JSON fields, as a Spark task does it, one process
  plain consumer  what a user would write (scripts/plain_consumer.py): consume, json.loads, a dict aggregate,
                  one CAS commit; its whole process on the small batch's records and on the big one's
  spark small/big the pipeline on a topic of SMALL (1M) and one of RECORDS (3M), in both modes (Spark Connect, the
                  samples' default, and spark-submit); marginal rate, and the batch size from which
                  spark-submit reads 1.5x the plain consumer's rate (Spark Connect warmed first: WARM_UP_BATCHES
                  unmeasured batches, as a long-lived server has run)
  many partitions MANY x (100k/MANY) records against 4 x 25,000 (same 100k records), Spark job wall time
  fixed cost      a 1,000-record batch, with the phases of its timings, against the plain consumer's whole
                  process over the same records; on Spark Connect also after a minute idle (Spark has then
                  killed its Python workers)
  airflow         the same batch as an Airflow DAG run (Airflow started here on the bench's pipelines, its
                  scheduler and LocalExecutor): the execute task's duration, and the whole run's
  kafka-sink      the small size's records published to a topic by a pipeline's Kafka sink, against a plain
                  consume-transform-produce loop committing a transaction every 10,000 records, on the same
                  messages: the loop adding the sink's lineage headers, and the sink without them against the
                  loop without; and one batch of --publish-big (10M) records, the driver's peak memory
                  against the small size's
  metrics         a 1,000-record batch with Airflow's StatsD metrics on, sent to a listening socket and to a
                  backend that is down (a host that does not resolve), the same with OpenTelemetry (an
                  OTLP receiver, a closed port), against the same with metrics off
  commit          commit_batch of 100k distinct aggregate contribution rows
  many keys       records over about as many (user, minute) keys: the job via Spark Connect and spark-submit
                  against the plain consumer aggregating the same, and the commit of that many contribution rows
  upsert          an upsert pipeline over UPSERT_RECORDS records of UPSERT_KEYS customers (5% tombstones),
                  via spark-submit and via Spark Connect, against a plain consumer that upserts each
                  consumed chunk with execute_values (the Kafka Connect JDBC sink's way); the commit of
                  100k changed keys; the history table's size per million records
  avro            AVRO_RECORDS (3M) and SMALL (1M) Avro page views (two schema versions, through the Schema
                  Registry), a topic each: the job (Spark Connect warmed up first) against a plain consumer
                  decoding with AvroDeserializer
  after abort     AFTER_ABORT_RECORDS records committed by a transactional producer that aborted once before
                  the position, against the same from one that never aborted: a batch of each via Spark Connect
  contributions   the size of the per-range contributions table per million records read
  planning        plan_batch over the MANY partitions
  peak RSS, CPU   driver, JVM, Python workers and the broker of each run (sampled every 0.1 s; under Spark
                  Connect the local server's JVM and workers)
  peers           what users would pick instead (scripts/peers), on the same topics, each checked to give the
                  pipeline's rows or messages: Spark's Kafka batch source, an AvailableNow stream and KafkaRDD
                  beside the JSON and Avro jobs; Debezium's JDBC sink beside the upsert; Kafka Streams beside
                  the Kafka sink
  scale           a 1,000-record and a 1M-record batch over MANY partitions against over 4 (and 50 and 200:
                  the curve; Spark Connect), the commit of their ranges, and `status` and the console's page
                  for MANY partitions behind
  parse           the DAG file over 10 to PIPELINES (200) pipeline files, each with its own table: its own time
                  (Airflow's import not counted) and `airflow dags report`'s (Airflow's DagBag parse)
  concurrent      CONCURRENT (20) pipelines, two a topic, started together on one Spark Connect server and one
                  Postgres, against as many run one after another; every table checked against its topic
  curve           the pipeline, the Spark peers and the plain consumer at 1k, 10k and 100k records; with the
                  json part's sizes, the chart of records/s against batch size (--chart, docs/benchmarks.png)
The many-keys, upsert and Avro plain consumers run in a fresh process each, their interpreter's start
not counted. Measures run in rounds (--repeat, 3): each figure is its best round (the JSON keeps every
sample), so a slow minute of a shared machine does not decide a ratio.
Prints ONE table with each target's ratio and PASS/FAIL, also written as JSON (--json). The
single-process reads report their CPU time (librdkafka's threads too). --only runs some parts.
Targets live here, not in tests. BENCH_ARGS scales it down: --records 200000 --small 100000 --many 100 --publish-big 1000000 --repeat 1.
"""

from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import plain_consumer  # scripts/, beside this file
import psutil
import pyarrow as pa
import yaml
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from peers import launch as peer_launch  # scripts/peers/
from psycopg2 import sql

from kafka_batch import connections
from kafka_batch.cli.commands import submit_batch
from kafka_batch.config import PROJECT_ROOT, load_pipeline
from kafka_batch.core import attempts, batches, database, planning
from kafka_batch.core.commit import commit_batch
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch.observability import timings
from kafka_batch.sinks.base import RangeCounts, SinkOutput
from kafka_batch.spark import connect, jvm_archive
from kafka_batch.spark.reader import read_task
from kafka_batch.spark.submit import spark_environment
from kafka_batch_dev import local_stack, sample_data
from kafka_batch_dev.airflow_api import Server

ROWS: list[dict] = []
# Seconds of each system's best run by records per batch, from its command's start: the chart's points.
CURVE: dict[str, dict[int, float]] = defaultdict(dict)
# The two ways a batch reaches Spark (the pipeline's Spark connection): a long-lived Spark Connect server
# (the samples' connection, started by `kafka-batch local up`), and spark-submit per batch.
SUBMIT, CONNECT = "spark_default", "spark_connect_default"
MODE = {SUBMIT: "spark-submit", CONNECT: "Spark Connect"}
KAFKA_BATCH = str(Path(sys.executable).parent / "kafka-batch")
IDLE_S = 65  # Spark kills a Python worker idle for a minute
# Batches a part runs through Spark Connect before it measures, unmeasured. A server session compiles
# its generated code, and the JVM's JIT compiles the hot paths, over its first batches: on a fresh
# server the JVM's CPU for the same 1M-record batch was 11 s in its first batch, 2.0-2.2 s in the next
# two, 1.4-1.7 s in the three after, and 0.95-1.16 s from the seventh. A long-lived server (the issue's
# "warmed Spark Connect server") has run many.
WARM_UP_BATCHES = 8


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def settle(idle_pct: float = 15.0, longest_s: float = 180.0) -> None:
    """Wait until the machine is nearly idle before a measure: after a large produce or batch the services
    keep working for a while (the broker's and Postgres's writes, the JVMs' collections and compilations),
    and no measure may pay for another one's leftovers."""
    started = time.monotonic()
    while (busy := psutil.cpu_percent(interval=2)) > idle_pct:
        if time.monotonic() - started > longest_s:
            print(f"  (the machine is still {busy:.0f}% busy after {longest_s:.0f}s; measuring anyway)", flush=True)
            return


def delete_topics(kafka: dict, prefix: str) -> None:
    """The bench's topics go when it ends: millions of records left behind would fill the local home's disk
    run after run."""
    admin = AdminClient(kafka)
    mine = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
    for future in admin.delete_topics(mine, operation_timeout=60).values() if mine else []:
        future.result()


def row(name: str, value: float, unit: str, detail: str = "", **extra) -> dict:
    """Record a measure; measured again (--repeat), its row keeps the best value and every sample."""
    entry = {"name": name, "value": round(value, 3), "unit": unit, "load": load(), "detail": detail, **extra}
    print(f"  {name}: {value:,.2f} {unit} {detail} (load {entry['load']})", flush=True)
    previous = next((r for r in ROWS if r["name"] == name), None)
    if previous is None:
        ROWS.append(entry | {"samples": [entry["value"]]})
        return ROWS[-1]
    previous["samples"].append(entry["value"])
    if (value > previous["value"]) if unit == "records/s" else (value < previous["value"]):
        previous.update(entry)
    return previous


class Env:
    def __init__(self, prefix: str, pipelines: Path):
        self.prefix = prefix
        self.pipelines = pipelines
        self.kafka = connections.kafka_config(connections.from_environment("kafka_default"))
        self.postgres = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
        self.registry = connections.schema_registry_config(connections.from_environment("schema_registry_default"))
        self.spark_connect = connect.connection_url(connections.from_environment("spark_connect_default"))
        self.tables: list[tuple[str, str]] = []

    def pipeline(self, name: str, topic: str, spark: str = SUBMIT, group: str = "page", **limits):
        """The page_views sample on a bench topic; `group`: the field it groups by with the minute."""
        definition = self._sample("page_views", name, topic, spark, limits)
        definition["sinks"]["aggregate"]["group_by"]["page"]["expr"] = group
        return self._written(definition)

    def avro_pipeline(self, name: str, topic: str, spark: str = SUBMIT):
        """The page_views_avro sample on a bench topic."""
        return self._written(self._sample("page_views_avro", name, topic, spark, {}))

    def _sample(self, sample: str, name: str, topic: str, spark: str, limits: dict) -> dict:
        """A sample aggregate pipeline's definition on a bench topic, with a table of its own and no
        limit on a batch's size."""
        definition = yaml.safe_load((PROJECT_ROOT / "pipelines" / f"{sample}.yaml").read_text())
        name = f"{self.prefix}_{name}"
        definition.update(name=name, topics=topic if isinstance(topic, dict) else [topic], schedule=None)
        definition["connections"]["spark"] = spark
        definition["limits"] = {**definition.get("limits", {}), "max_records_per_partition": 10**9,
                                "max_records_per_batch": 10**9, **limits}
        definition["sinks"]["aggregate"]["table"] = f"{name}_minutes"
        return definition

    def publishing_pipeline(self, name: str, topic: str, output: str, spark: str = CONNECT, limits: dict | None = None,
                            headers: list[str] | None = None):
        """The page views, each published to `output` (key user_id; page and duration): a Kafka sink alone,
        its batches bounded to 10M records (a publish must fit the transaction's timeout); `headers`: the
        lineage headers its messages carry (default: all)."""
        definition = self._sample("page_views", name, topic, spark, {"max_records_per_batch": 10**7, **(limits or {})})
        definition["sinks"] = {"kafka": {"topic": output, "key": "user_id", "value": {
            "page": "page", "duration_ms": {"expr": "duration_ms", "type": "bigint"}},
            **({} if headers is None else {"headers": headers})}}
        return self._written(definition)

    def _written(self, definition: dict):
        """The pipeline of this definition, written among the bench's pipelines; its tables dropped at the end."""
        (self.pipelines / f"{definition['name']}.yaml").write_text(yaml.safe_dump(definition))
        # Its expressions analyzed once, untimed, as its first plan would (a local JVM for spark-submit).
        subprocess.run([KAFKA_BATCH, "validate", "--pipeline", definition["name"]], check=True, capture_output=True)
        pipeline = load_pipeline(definition["name"])
        for sink in pipeline.sinks:
            if sink.tables:
                self.tables += [("public", sink.table), ("kafka_batch", sink.contributions_name)]
        return pipeline

    def plan(self, pipeline, run_id: str = "bench"):
        conn = database.connect(self.postgres)
        try:
            return planning.plan_batch(conn, KafkaOffsets(self.kafka), pipeline, run_id=run_id)
        finally:
            conn.close()


def produce_per_partition(kafka: dict, topic: str, partitions: int, per_partition: int, seed: int) -> None:
    """Exactly `per_partition` page views in every partition (keys as sample_data makes them)."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka["bootstrap.servers"], "enable.idempotence": True,
                         "linger.ms": 20, "batch.num.messages": 10_000})
    for i in range(partitions * per_partition):
        key, value = sample_data.page_view(rng)
        sample_data.send(producer, topic, key, json.dumps(value), partition=i % partitions)
    sample_data.flush(producer, topic, 120)


def spans(ranges) -> list[tuple[str, int, int, int]]:
    """A batch's ranges as the plain consumer takes them."""
    return [(r.topic, r.partition, r.from_offset, r.until_offset) for r in ranges]


def read_row(name: str, what: str, read, *args) -> dict:
    """The row of one single-process read: records/s, with its CPU time (all its threads, librdkafka's
    too), in a fresh process started from a nearly idle machine. Run here instead, the reads took up to
    twice the CPU after the first Spark jobs: this process then holds Spark Connect's and Airflow's
    clients."""
    settle()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        n, s, cpu = pool.apply(_timed_here, (read, *args))
    return row(name, n / s, "records/s", f"{n:,} records in {s:.1f}s, CPU {cpu:.1f}s ({what})", cpu_seconds=round(cpu, 2))


def _timed_here(read, *args) -> tuple[int, float, float]:
    started, cpu = time.monotonic(), time.process_time()
    count = read(*args)
    return count, time.monotonic() - started, time.process_time() - cpu


def raw_read(env: Env, ranges) -> int:
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    count = sum(1 for _ in plain_consumer.consume(consumer, spans(ranges)))
    consumer.close()
    return count


def project_read(env: Env, pipeline, ranges) -> int:
    from kafka_batch.spark.job import _columns, _decoder, _values

    decoder = _decoder(pipeline, lambda _pipeline: None)
    return sum(b.num_rows for b in read_task(env.kafka, list(ranges), pipeline.read.model_dump(), _columns(pipeline),
                                             decoder, _values(pipeline, decoder)))


def baseline_tables(env: Env, name: str) -> list[tuple[str, str]]:
    return [("public", f"{env.prefix}_{name}_totals"), ("public", f"{env.prefix}_{name}_offsets")]


def baseline(env: Env, ranges, name: str, group: str = "page") -> int:
    """The hand-written job (scripts/plain_consumer.py): consume, parse with json, aggregate in a dict by
    (`group`, minute), commit with compare-and-set (into tables of its own `name`, `baseline_tables`: one
    pair per round)."""
    return plain_consumer.run(env.kafka, env.postgres, spans(ranges), f"{env.prefix}_{name}", group)


def avro_baseline(env: Env, ranges, name: str) -> int:
    """The hand-written job on Avro values: consume, decode with confluent-kafka's AvroDeserializer (the
    registry's writer schema, read as the sample's view), aggregate by (page, country, minute of
    viewed_at), commit with compare-and-set."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserialize = AvroDeserializer(SchemaRegistryClient({"url": env.registry["url"]}),
                                   json.dumps(sample_data.PAGE_VIEW_V2))
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    totals: dict = defaultdict(lambda: [0, 0])
    count = 0
    for m in plain_consumer.consume(consumer, spans(ranges)):
        count += 1
        record = deserialize(m.value(), SerializationContext(m.topic(), MessageField.VALUE))
        t = totals[(record["page"] + "/" + record["country"], record["viewed_at"].replace(second=0, microsecond=0))]
        t[0] += 1
        t[1] += record["duration_ms"]
    consumer.close()
    plain_consumer.commit(env.postgres, spans(ranges), f"{env.prefix}_{name}", totals)
    return count


class ProcessSampler:
    """Peak RSS and CPU seconds, by kind, of the processes a batch runs in: those below this process (the
    CLI, spark-submit's JVM and its Python workers) and the local services' (the broker's JVM, and
    with `connect` the Spark Connect server's JVM and its Python workers), sampled every 0.1 s. CPU counts what each process
    used while sampled (a worker that starts and ends between two samples is missed)."""

    KINDS = ("driver", "jvm", "worker", "broker")

    def __init__(self, connect: bool):
        self.peaks = dict.fromkeys(self.KINDS, 0)
        self._cpu: dict[int, tuple[str, float, float]] = {}  # pid -> (kind, first seen, last seen)
        state = local_stack.read_state()
        services = ("kafka_pid",) + (("spark_connect_pid",) if connect else ())
        self._services = [state[key] for key in services if key in state]
        self._broker = state.get("kafka_pid")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def cpu_seconds(self) -> dict[str, float]:
        used = dict.fromkeys(self.KINDS, 0.0)
        for kind, first, last in self._cpu.values():
            used[kind] += last - first
        return {kind: round(seconds, 2) for kind, seconds in used.items()}

    def _processes(self) -> list[psutil.Process]:
        found = psutil.Process().children(recursive=True)
        for pid in self._services:
            try:
                service = psutil.Process(pid)
                found += [service, *service.children(recursive=True)]
            except psutil.Error:
                continue
        return found

    def _kind(self, p: psutil.Process, cmd: str) -> str | None:
        if p.pid == self._broker:
            return "broker"
        if "java" in p.name():
            return "jvm"
        if "run_batch.py" in cmd or " run --pipeline" in cmd:
            return "driver"
        if "pyspark" in cmd and ("daemon" in cmd or "worker" in cmd):
            return "worker"
        return None

    def _sample(self, first: bool = False) -> None:
        for p in self._processes():
            try:  # a process may end between the listing and its reading
                cmd = " ".join(p.cmdline())
                rss, times = p.memory_info().rss, p.cpu_times()
                kind = self._kind(p, cmd)
            except psutil.Error:
                continue
            if kind is None:
                continue
            self.peaks[kind] = max(self.peaks[kind], rss)
            used = times.user + times.system
            seen = self._cpu.get(p.pid)
            self._cpu[p.pid] = (kind, used if first else 0.0, used) if seen is None else (kind, seen[1], used)

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()


def phases(marks: list[dict], spawned: float | None = None, ended: float | None = None) -> dict[str, float]:
    """Seconds per phase from the marks of the CLI, the driver and the read tasks."""
    first = {}
    for m in marks:
        first.setdefault(m["event"], m["t"])
    task_starts = [m["t"] for m in marks if m["event"] == "task_start"]
    task_ends = [m["t"] for m in marks if m["event"] == "task_end"]
    t = dict(first, task_start=min(task_starts, default=None), task_end=max(task_ends, default=None))
    spans = [
        ("process start", spawned, t.get("cli_start")), ("plan", t.get("plan_start"), t.get("plan_done")),
        ("spark-submit call built", t.get("submit_prepare"), t.get("submit_start")),
        ("JVM + driver start", t.get("submit_start"), t.get("job_main")),
        ("Spark session", t.get("job_main"), t.get("session_ready")),
        ("load batch + plan tasks", t.get("session_ready"), t.get("read_start")),
        ("first task start", t.get("read_start"), t.get("task_start")),
        ("read (tasks)", t.get("task_start"), t.get("task_end")),
        ("aggregate to driver", t.get("task_end"), t.get("computed")),
        ("commit", t.get("commit_start"), t.get("commit_done")),
        ("stop + exit", t.get("commit_done"), ended or t.get("submit_done")),
    ]
    return {name: round(b - a, 2) for name, a, b in spans if a is not None and b is not None}


def cli_run(pipeline, run_id: str | None = None, env: dict[str, str] | None = None) -> tuple[float, dict[str, float]]:
    """`kafka-batch run` of the pipeline (the batch of `run_id`, else its next one), timed from the command's
    start as a user sees it: (seconds, its phases from the timings marks); `env` over the environment."""
    marks = Path(tempfile.mkstemp(prefix="kafka_batch_timings_")[1])
    command = [KAFKA_BATCH, "run", "--pipeline", pipeline.name, *(["--run-id", run_id] if run_id else [])]
    started_wall, started = time.time(), time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, **(env or {}), timings.ENV: str(marks)})
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
    row(f"spark job {label}", records / seconds, "records/s",
        f"{records:,} records, {len(batch.ranges)} ranges, {read_tasks} read tasks in {seconds:.1f}s (kafka-batch run);"
        f" peak RSS MB {mb}; CPU s {cpu}; phases {breakdown}", seconds=round(seconds, 2), records=records, rss_mb=mb,
        cpu_s=cpu, phases=breakdown, read_tasks=read_tasks)
    return {"seconds": seconds, "records": records, "rss": mb, "phases": breakdown}


def warm_up(env: Env, make_pipeline, batches: int = WARM_UP_BATCHES) -> None:
    """Run `batches` batches of pipelines made by `make_pipeline(i)` through Spark Connect, unmeasured (see
    WARM_UP_BATCHES); each reads its topic from the start."""
    started = time.monotonic()
    for i in range(batches):
        pipeline = make_pipeline(i)
        cli_run(pipeline, env.plan(pipeline).run_id)
    print(f"  warm-up: {batches} batches via Spark Connect, not measured, in {time.monotonic() - started:.1f} s"
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


def plain_process(env: Env, ranges: list[tuple[str, int, int, int]], rounds: int = 3,
                  name: str = "plain consumer process") -> dict:
    """The plain consumer over `ranges` as a whole process (scripts/plain_consumer.py: interpreter start,
    imports, consume, json, dict, CAS commit), wall-clock from its start; the best of `rounds`."""
    script = str(Path(__file__).with_name("plain_consumer.py"))
    records = sum(until - start for _, _, start, until in ranges)
    for _ in range(rounds):
        settle()
        table = f"{env.prefix}_plain_{uuid.uuid4().hex[:8]}"
        env.tables += [("public", f"{table}_offsets"), ("public", f"{table}_totals")]
        started = time.monotonic()
        subprocess.run([sys.executable, script, "--kafka", json.dumps(env.kafka), "--postgres", json.dumps(env.postgres),
                        "--ranges", json.dumps(ranges), "--table", table], check=True, capture_output=True)
        best = row(name, time.monotonic() - started, "s", f"scripts/plain_consumer.py over {records:,} records, whole"
                   " process")
    return best


# Spark's own ways to read a batch, run beside the pipeline on the same topics, Spark and Postgres
# (scripts/peers/spark_peer.py): (name, spark_peer mode, where it runs). KafkaRDD has no Spark Connect API.
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
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **environment})
    seconds = time.monotonic() - started
    if checkpoint:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"{label} failed (exit {result.returncode}): {result.stderr[-3000:]}")
    if expected is None:
        return seconds
    read = int(result.stdout.split()[-1])
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        differ = peer_launch.same_rows(cur, expected, table, columns)
    conn.close()
    if read != records or differ:
        raise RuntimeError(f"{label}: read {read:,} of {records:,} records; {differ} rows differ from the pipeline's"
                           f" {expected} (its table {table} is kept)")
    row(label, records / seconds, "records/s", f"{records:,} records in {seconds:.1f}s, whole process (spark_peer.py"
        f" --mode {mode}); its rows are the pipeline's", seconds=round(seconds, 2))
    if "format" not in options:  # the chart is of the JSON aggregate
        CURVE[f"{name}, {MODE[spark]}"][records] = min(seconds, CURVE[f"{name}, {MODE[spark]}"].get(records, seconds))
    return seconds


def warm_up_peers(env: Env, ranges, batches: int = WARM_UP_BATCHES, **options: str) -> None:
    """Run each Spark peer of the Spark Connect server `batches` times over `ranges`, unmeasured, as the
    pipeline is warmed up (warm_up): the server's JVM compiles the Kafka source's hot paths as it did the
    pipeline's, a long-lived server having run many."""
    started = time.monotonic()
    for peer in SPARK_PEERS:
        if peer[2] == CONNECT:
            for _ in range(batches):
                peer_run(env, peer, "warm-up", ranges, 0, None, [], **options)
    print(f"  warm-up: {batches} runs of each Spark peer via Spark Connect, not measured, in"
          f" {time.monotonic() - started:.1f} s (load {load()})", flush=True)


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


def jvm_archive_state() -> str:
    """Whether this spark-submit maps the driver JVM's class archive, or writes it (a slower run)."""
    path = jvm_archive.archive_path(spark_environment())
    return "off" if path is None else "mapped" if path.exists() else "written by this run"


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


def commit_rows(env: Env, rows: int, name: str = "commit") -> float:
    """commit_batch of `rows` distinct (range, page, minute) contributions, spread over 4 ranges. `name`: the
    pipeline's and its topic's, new for each measure (a committed batch leaves nothing to plan)."""
    topic = f"{env.prefix}_{name}"
    sample_data.ensure_topic(env.kafka, topic, 4)
    produce_per_partition(env.kafka, topic, 4, 10, seed=3)
    pipeline = env.pipeline(name, topic)
    batch = env.plan(pipeline)
    ids = [r.range_id for r in batch.ranges]
    base = 1_700_000_000_000_000
    result = pa.table({
        "range_id": pa.array([ids[i % len(ids)] for i in range(rows)], pa.int64()),
        "page": pa.array([f"/page/{i}" for i in range(rows)], pa.string()),
        "minute": pa.array([base + (i % 1000) * 60_000_000 for i in range(rows)], pa.timestamp("us", tz="UTC")),
        "views": pa.array([1] * rows, pa.int64()),
        "total_duration_ms": pa.array([i for i in range(rows)], pa.int64()),
    })
    counts = {rid: RangeCounts(records=10) for rid in ids}
    conn = database.connect(env.postgres)
    try:
        attempt = attempts.claim_attempt(conn, batch.id)
        settle()  # timed from a nearly idle machine
        started = time.monotonic()
        commit_batch(conn, pipeline, batch.id, attempt, {"aggregate": SinkOutput(counts, result)}, 1)
        seconds = time.monotonic() - started
    finally:
        conn.close()
    return seconds


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


def measure_many_keys(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The high-cardinality aggregate: records over about as many (user, minute) keys, the whole job
    against the plain consumer (same aggregation), and the commit of that many contribution rows."""
    topic = f"{env.prefix}_many_keys"
    sample_data.ensure_topic(env.kafka, topic, args.partitions)
    sample_data.produce_page_views(env.kafka, topic, args.many_keys_records, seed=11, users=args.many_keys_users)
    planned = [(label, pipeline, env.plan(pipeline)) for label, pipeline in (
        (f"many keys, {MODE[spark]}", env.pipeline(f"many_keys_{i}_{spark}", topic, spark, group="user_id"))
        for i in range(args.repeat) for spark in (CONNECT, SUBMIT))]
    def baseline_round(i: int) -> dict:
        env.tables += baseline_tables(env, f"many_keys_baseline_{i}")
        return read_row("many keys plain consumer", "consume + json + dict by (user, minute) + CAS commit", baseline,
                        env, planned[0][2].ranges, f"many_keys_baseline_{i}", "user_id")

    base, best = side_by_side(args.repeat, planned, baseline_round, env)
    pipeline = planned[0][1]
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {pipeline.sinks[0].table}")
        (keys,) = cur.fetchone()
    conn.close()
    row("many keys: distinct keys", keys, "keys", f"(user, minute) keys of {planned[0][2].span:,} records")
    for i in range(args.repeat):
        commit = row("commit, many keys", commit_rows(env, args.many_keys_records, f"commit_many_{i}"), "s",
                     f"{args.many_keys_records:,} distinct contribution rows")
    return [
        *mode_targets(8, "many keys", planned[0][2].span, base, best),
        (f"8 commit of {args.many_keys_records / 1e6:g}M contribution rows (s) <= 2", commit["value"], 2, "<="),
    ]


def measure_kafka_sink(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The small size's records through a pipeline whose one sink publishes each record to a topic (Spark
    Connect), against the plain exactly-once publisher (scripts/plain_publisher.py: Kafka's own
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
    plain_s, lineage_s, sink_runs, bare_s, streams_s = [], [], [], [], []
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
            (f"55 driver peak RSS, rows to a topic, {args.publish_big / 1e6:g}M / {size} <= 1.25",
             big["rss"]["driver"] / driver, 1.25, "<=")]


def plain_publisher_run(env: Env, batch, output: str, lineage: str | None = None) -> float:
    """scripts/plain_publisher.py over the batch's ranges into a new topic `output`, its whole process
    timed; `lineage`: `pipeline:batch`, for the sink's headers. Its seconds."""
    sample_data.ensure_topic(env.kafka, output, topic_partitions(env, batch.ranges[0].topic))
    command = [sys.executable, str(Path(__file__).with_name("plain_publisher.py")), "--kafka", json.dumps(env.kafka),
               "--ranges", json.dumps(spans(batch.ranges)), "--output", output, *(["--lineage", lineage] if lineage else [])]
    settle()
    started = time.monotonic()
    subprocess.run(command, check=True, capture_output=True)
    return row(f"plain exactly-once publisher process{', with the lineage headers' if lineage else ''}",
               time.monotonic() - started, "s", f"scripts/plain_publisher.py over {batch.span:,} records, whole process"
               )["value"]


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


def published(env: Env, topic: str, headers: bool = False) -> Counter:
    """Every committed message of `topic` as (key, value parsed, and its headers if `headers`), counted:
    two topics hold the same messages when these are equal, whatever their partitions and order."""
    kafka = KafkaOffsets(env.kafka)
    offsets = kafka.offsets(kafka.partitions((topic,)))
    ranges = [(t, p, o.log_start, o.last_stable) for (t, p), o in offsets.items()]
    consumer = plain_consumer.consumer(env.kafka, ranges)
    found = Counter((m.key(), tuple(sorted(json.loads(m.value()).items())), tuple(m.headers() or ()) if headers else ())
                    for m in plain_consumer.consume(consumer, ranges))
    consumer.close()
    return found


def streams_run(env: Env, topic: str, expected: str, records: int, n: int) -> float:
    """The Kafka Streams application (exactly_once_v2) over `topic` into a new topic, its whole process
    timed; its messages must be the pipeline's (in `expected`). Its seconds."""
    output = f"{expected}_streams"
    partitions = topic_partitions(env, topic)
    sample_data.ensure_topic(env.kafka, output, partitions)
    command = peer_launch.streams_command(local_stack.home(), env.kafka, topic, output, f"{env.prefix}_streams_{n}",
                                          min(partitions, os.cpu_count() or 2))
    settle()  # timed from a nearly idle machine
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **spark_environment()})
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"Kafka Streams failed (exit {result.returncode}): {result.stderr[-3000:]}")
    if published(env, output) != published(env, expected):
        raise RuntimeError(f"Kafka Streams' {output} does not hold the pipeline's messages ({expected})")
    row("Kafka Streams, rows to a topic", records / seconds, "records/s", f"{records:,} records in {seconds:.1f}s,"
        " its whole process (exactly_once_v2); its messages are the pipeline's", seconds=round(seconds, 2))
    return seconds


def measure_avro(args: argparse.Namespace, env: Env) -> list[tuple]:
    """Avro page views through the Schema Registry (two schema versions) at the small and the big size,
    the whole job (`kafka-batch run`) against a plain consumer decoding with confluent-kafka's
    AvroDeserializer on the same records (run in a fresh process, its interpreter's start not counted)."""
    small = min(args.small, args.avro_records)
    topics = {"small": f"{env.prefix}_avro_small", "big": f"{env.prefix}_avro"}  # a topic of each size, as for JSON
    for size, records in (("big", args.avro_records), ("small", small)):
        sample_data.ensure_topic(env.kafka, topics[size], args.partitions)
        started = time.monotonic()
        sample_data.produce_page_views_avro(env.kafka, {"url": env.registry["url"]}, topics[size], records, seed=12)
        print(f"produced {records:,} Avro records to {topics[size]} in {time.monotonic() - started:.1f}s", flush=True)
    sizes = {"small": f"{small / 1e6:g}M", "big": f"{args.avro_records / 1e6:g}M"}
    jobs = [("small", CONNECT), ("big", CONNECT), ("big", SUBMIT)]
    rounds = [[(f"avro {sizes[size]}, {MODE[spark]}", pipeline, env.plan(pipeline)) for size, spark in jobs
               for pipeline in [env.avro_pipeline(f"avro_{i}_{size}_{spark}", topics[size], spark)]]
              for i in range(args.repeat)]
    ranges = {"small": rounds[0][0][2].ranges, "big": rounds[0][1][2].ranges}
    records = {"small": rounds[0][0][2].span, "big": rounds[0][1][2].span}
    base: dict[str, dict] = {}
    runs: dict[str, list[float]] = defaultdict(list)
    warm_up(env, lambda i: env.avro_pipeline(f"avro_warm_{i}", topics["small"], CONNECT))
    warm_up_peers(env, ranges["small"], format="avro", group="page,country", registry=env.registry["url"])
    for i, planned in enumerate(rounds):
        for size in ("small", "big"):
            env.tables += baseline_tables(env, f"avro_baseline_{size}_{i}")
            base[size] = read_row(f"avro plain consumer, {sizes[size]}", "consume + AvroDeserializer + dict by (page,"
                                  " country, minute) + CAS commit", avro_baseline, env, ranges[size],
                                  f"avro_baseline_{size}_{i}")
        for label, pipeline, batch in planned:
            runs[label].append(spark_run(env, pipeline, batch, label)["seconds"])
        for (_label, pipeline, batch), size in zip(planned[:2], ("small", "big"), strict=True):
            for peer in SPARK_PEERS:
                runs[f"{peer[0]} Avro {sizes[size]}, {MODE[peer[2]]}"].append(peer_run(
                    env, peer, f"Avro {sizes[size]}", batch.ranges, batch.span, pipeline.sinks[0].table, AVRO_COLUMNS,
                    format="avro", group="page,country", registry=env.registry["url"]))
    best = {label: min(seconds) for label, seconds in runs.items()}

    def ratio(size: str, spark: str) -> float:
        return records[size] / best[f"avro {sizes[size]}, {MODE[spark]}"] / base[size]["value"]

    return [(f"9 avro {sizes['small']}: kafka-batch run / plain consumer >= 1.5, {MODE[CONNECT]}",
             ratio("small", CONNECT), 1.5, ">="),
            (f"9 avro {sizes['big']}: the same >= 2, {MODE[CONNECT]}", ratio("big", CONNECT), 2, ">="),
            (f"9 avro {sizes['big']}: the same >= 1.5, {MODE[SUBMIT]}", ratio("big", SUBMIT), 1.5, ">="),
            *peer_targets(14, f"Avro {sizes['small']}", {MODE[CONNECT]: best[f"avro {sizes['small']}, {MODE[CONNECT]}"]},
                          best),
            *peer_targets(14, f"Avro {sizes['big']}", {mode: best[f"avro {sizes['big']}, {mode}"]
                                                      for mode in (MODE[CONNECT], MODE[SUBMIT])}, best)]


def produce_transactions(kafka: dict, topic: str, transactions: list[tuple[int, bool]], seed: int) -> None:
    """Page views in transactions of ONE transactional id, as exactly-once producers write: (records,
    committed) each, spread over the partitions."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka["bootstrap.servers"], "transactional.id": f"{topic}-producer",
                         "linger.ms": 20, "batch.num.messages": 10_000})
    producer.init_transactions(60)
    for count, commit in transactions:
        producer.begin_transaction()
        for _ in range(count):
            key, value = sample_data.page_view(rng)
            sample_data.send(producer, topic, key, json.dumps(value))
        sample_data.flush(producer, topic, 300)
        producer.commit_transaction(120) if commit else producer.abort_transaction(120)


def measure_after_abort(args: argparse.Namespace, env: Env) -> list[tuple]:
    """A batch over records whose producer aborted a transaction before the position, against one over a
    producer that never aborted (same records, same id pattern, Spark Connect): placing the abort must
    cost the read nothing."""
    planned: dict[str, list] = {}
    for kind, head in (("clean", [(1000, True)]), ("aborted", [(1000, True), (1000, False)])):
        topic = f"{env.prefix}_{kind}"
        sample_data.ensure_topic(env.kafka, topic, args.partitions)
        produce_transactions(env.kafka, topic, head, seed=13)
        pipelines = [env.pipeline(f"{kind}_{i}", topic, CONNECT) for i in range(args.repeat)]
        for pipeline in pipelines:  # the positions past the head, and past its aborted transaction
            submit_batch(pipeline, env.plan(pipeline, "head").id, verbose=False)
        produce_transactions(env.kafka, topic, [(args.after_abort_records, True)], seed=14)
        planned[kind] = [(pipeline, env.plan(pipeline, "measured")) for pipeline in pipelines]
    runs: dict[str, list[dict]] = defaultdict(list)
    for i in range(args.repeat):
        for kind, batches_of_kind in planned.items():
            pipeline, batch = batches_of_kind[i]
            runs[kind].append(spark_run(env, pipeline, batch, f"{kind} producer, {MODE[CONNECT]}",
                                        records=args.after_abort_records))
    best = {kind: min(r["seconds"] for r in rs) for kind, rs in runs.items()}
    return [("10 read after an abort / without >= 0.9, Spark Connect", best["clean"] / best["aborted"], 0.9, ">=")]


def upsert_pipeline(env: Env, name: str, topic: str, spark: str):
    """The `customers` sample on the bench's topic, with tables of its own."""
    definition = yaml.safe_load((PROJECT_ROOT / "pipelines" / "customers.yaml").read_text())
    name = f"{env.prefix}_{name}"
    definition.update(name=name, topics=[topic], connections={"spark": spark},
                      limits={"max_records_per_partition": 10**9, "max_records_per_batch": 10**9})
    definition["sinks"]["upsert"]["table"] = name
    (env.pipelines / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    pipeline = load_pipeline(name)
    [sink] = pipeline.sinks
    env.tables += [("public", sink.table), ("kafka_batch", sink.history_name)]
    return pipeline


def upsert_baseline(env: Env, ranges, name: str) -> int:
    """What a user writes without the project (the Kafka Connect JDBC sink's way): per consumed chunk, the
    last record per key upserted with execute_values, tombstones deleted, and the offsets moved by
    compare-and-set, in one transaction."""
    import psycopg2
    from psycopg2.extras import execute_values

    table = f"{env.prefix}_{name}"
    conn = psycopg2.connect(**env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (customer_id text PRIMARY KEY, name text, balance bigint,"
                    " updated_at timestamptz)")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_offsets (topic text, partition int, next_offset bigint,"
                    " PRIMARY KEY (topic, partition))")
        execute_values(cur, f"INSERT INTO {table}_offsets VALUES %s ON CONFLICT DO NOTHING",
                       [(r.topic, r.partition, r.from_offset) for r in ranges])
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    ends = {(r.topic, r.partition): r.until_offset for r in ranges}
    count, chunk, positions = 0, {}, {}
    messages = plain_consumer.consume(consumer, spans(ranges))

    def flush():
        with conn, conn.cursor() as cur:
            for (topic, partition), (start, end) in positions.items():
                cur.execute(f"UPDATE {table}_offsets SET next_offset = %s WHERE topic = %s AND partition = %s"
                            " AND next_offset = %s", (end, topic, partition, start))
                if cur.rowcount != 1:
                    raise RuntimeError("compare-and-set lost")
            rows = [(k, v["name"], v["balance"], datetime.fromtimestamp(v["updated_at"] / 1000, UTC))
                    for k, v in chunk.items() if v is not None]
            if rows:
                execute_values(cur, f"INSERT INTO {table} VALUES %s ON CONFLICT (customer_id) DO UPDATE SET"
                               " name = EXCLUDED.name, balance = EXCLUDED.balance, updated_at = EXCLUDED.updated_at", rows)
            gone = [k for k, v in chunk.items() if v is None]
            if gone:
                cur.execute(f"DELETE FROM {table} WHERE customer_id = ANY(%s)", (gone,))
        chunk.clear()
        positions.clear()

    for m in messages:
        count += 1
        key = (m.topic(), m.partition())
        start = positions.get(key, (None, None))[0]
        positions[key] = (m.offset() if start is None else start, m.offset() + 1)
        chunk[m.key().decode()] = None if m.value() is None else json.loads(m.value())
        if count % 10_000 == 0 or m.offset() + 1 >= ends[key]:
            flush()
    flush()
    consumer.close()
    conn.close()
    return count


def history_size(env: Env, pipeline, records: int) -> None:
    [sink] = pipeline.sinks
    table = sql.Identifier("kafka_batch", sink.history_name)
    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT pg_total_relation_size(%s), count(*), count(DISTINCT customer_id) FROM {}")
                    .format(table), (table.as_string(cur),))
        size, rows, keys = cur.fetchone()
    conn.close()
    row("upsert history table", size / 2**20 / (records / 1e6), "MB/M records",
        f"{rows:,} rows for {keys:,} keys, {size / 2**20:.1f} MB with indexes after {records:,} records (one row per"
        " key and range that changed it; the replay horizon folds older ranges into one row per key)", rows=rows)


def upsert_commit(env: Env, keys: int, name: str = "upsert_commit") -> tuple[float, float]:
    """commit_batch of an upsert result of `keys` keys staged as the executors stage it: once into an empty
    table (inserts), then the same keys changed (a second batch: updates against their history). `name`:
    the pipeline's and its topic's, new for each measure."""
    from kafka_batch.sinks import staging
    from kafka_batch.sinks.base import copy_arrow

    topic = f"{env.prefix}_{name}"
    sample_data.ensure_topic(env.kafka, topic, 4)
    pipeline = upsert_pipeline(env, name, topic, SUBMIT)
    [sink] = pipeline.sinks
    seconds = []
    for n in range(2):
        produce_per_partition(env.kafka, topic, 4, 10, seed=3 + n)
        batch = env.plan(pipeline, run_id=f"commit-{n}")
        conn = database.connect(env.postgres)
        try:
            attempt = attempts.claim_attempt(conn, batch.id)
            name = staging.create_stage(env.postgres, batch.id, attempt, sink.kind, sql.Identifier("kafka_batch",
                                                                                                     sink.history_name))
            ids = [r.range_id for r in batch.ranges]
            rows = pa.table({
                "range_id": pa.array([ids[i % len(ids)] for i in range(keys)], pa.int64()),
                "customer_id": pa.array([f"c{i:07d}" for i in range(keys)]),
                "deleted": pa.array([False] * keys),
                "kafka_topic": pa.array([topic] * keys),
                "kafka_partition": pa.array([i % len(ids) for i in range(keys)], pa.int32()),
                "kafka_offset": pa.array([n * keys + i for i in range(keys)], pa.int64()),
                "name": pa.array([f"name {n}"] * keys),
                "balance": pa.array([i + n for i in range(keys)], pa.int64()),
                "updated_at": pa.array([1_700_000_000_000_000 + i for i in range(keys)], pa.timestamp("us", tz="UTC")),
            })
            with conn, conn.cursor() as cur:
                copy_arrow(cur, staging.staged(name), rows.select(sink.history_columns))
            counts = {rid: RangeCounts(records=10) for rid in ids}
            settle()  # timed from a nearly idle machine
            started = time.monotonic()
            commit_batch(conn, pipeline, batch.id, attempt, {"upsert": SinkOutput(counts, staging.StagedRows(name, keys))}, 1)
            seconds.append(time.monotonic() - started)
        finally:
            conn.close()
    return seconds[0], seconds[1]


CUSTOMER_SCHEMA = {"type": "struct", "name": "customer", "optional": False, "fields": [
    {"field": "name", "type": "string", "optional": False},
    {"field": "balance", "type": "int64", "optional": False},
    {"field": "updated_at", "type": "int64", "name": "org.apache.kafka.connect.data.Timestamp", "version": 1,
     "optional": False}]}
CUSTOMER_KEY_SCHEMA = {"type": "struct", "name": "customer_key", "optional": False, "fields": [
    {"field": "customer_id", "type": "string", "optional": False}]}
UPSERT_COLUMNS = ["customer_id", "name", "balance", "updated_at"]


def copy_with_schemas(env: Env, ranges, topic: str) -> None:
    """The customers of `ranges` again in `topic`, each record in its partition and order, its value with
    its schema (Kafka Connect's JSON converter's envelope, which Debezium's JDBC sink needs to know its
    columns; its key likewise, a struct of customer_id, as Debezium's own connectors write keys), tombstones
    kept: the same changes in the form the connector reads."""
    sample_data.ensure_topic(env.kafka, topic, len(ranges))
    producer = Producer({"bootstrap.servers": env.kafka["bootstrap.servers"], "enable.idempotence": True,
                         "linger.ms": 20, "batch.num.messages": 10_000})
    consumer = plain_consumer.consumer(env.kafka, spans(ranges))
    for m in plain_consumer.consume(consumer, spans(ranges)):
        value = None
        if m.value() is not None:
            record = json.loads(m.value())
            value = json.dumps({"schema": CUSTOMER_SCHEMA, "payload": {k: record[k] for k in ("name", "balance",
                                                                                               "updated_at")}})
        key = json.dumps({"schema": CUSTOMER_KEY_SCHEMA, "payload": {"customer_id": m.key().decode()}})
        sample_data.send(producer, topic, key, value, partition=m.partition())
    consumer.close()
    sample_data.flush(producer, topic, 300)


def debezium_run(env: Env, topic: str, records: int, expected: str, n: int) -> float:
    """Kafka Connect standalone with Debezium's JDBC sink from `topic` into a new table, timed from its start
    until the table holds exactly the pipeline's rows (`expected`), the moment a user could read it; then
    stopped. Its seconds."""
    table = f"{env.prefix}_debezium_{n}"
    env.tables.append(("public", table))
    conn = database.connect(env.postgres)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (customer_id text PRIMARY KEY, name text, balance bigint,"
                    " updated_at timestamptz)")
        cur.execute(f"SELECT count(*) FROM {expected}")
        (rows,) = cur.fetchone()
    work = Path(tempfile.mkdtemp(prefix="kafka_batch_connect_"))
    tasks = min(topic_partitions(env, topic), os.cpu_count() or 2)
    command = peer_launch.connect_command(local_stack.home(), work, env.kafka, env.postgres, topic, table, tasks)
    settle()  # timed from a nearly idle machine
    log = open(work / "connect.log", "wb")
    started = time.monotonic()
    connect_worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                                                                           **spark_environment()})
    try:
        with conn.cursor() as cur:
            while True:
                failed = "will not recover until manually restarted" in (work / "connect.log").read_text()
                if connect_worker.poll() is not None or failed:
                    raise RuntimeError(f"Kafka Connect exited ({connect_worker.returncode}) or its task failed: "
                                       f"{(work / 'connect.log').read_text()[-3000:]}")
                if time.monotonic() - started > 900:
                    raise RuntimeError(f"Debezium's JDBC sink did not complete {table} in 900 s; see {work}")
                cur.execute(f"SELECT count(*) FROM {table}")
                if cur.fetchone()[0] == rows and not peer_launch.same_rows(cur, expected, table, UPSERT_COLUMNS):
                    break
                time.sleep(0.25)
        seconds = time.monotonic() - started
    finally:
        connect_worker.terminate()
        connect_worker.wait(60)
        log.close()
        conn.close()
    shutil.rmtree(work, ignore_errors=True)
    row(f"Debezium JDBC sink, {records / 1e6:g}M", records / seconds, "records/s",
        f"{records:,} records into {rows:,} rows in {seconds:.1f}s, Kafka Connect standalone from its start to the"
        f" table equal to the pipeline's ({tasks} tasks)", seconds=round(seconds, 2))
    return seconds


def topic_partitions(env: Env, topic: str) -> int:
    return len(KafkaOffsets(env.kafka).partitions((topic,)))


def measure_upsert(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The upsert line: its rows and its targets."""
    topic = f"{env.prefix}_customers"
    sample_data.ensure_topic(env.kafka, topic, args.partitions)
    sample_data.produce_customers(env.kafka, topic, args.upsert_records, seed=9, customers=args.upsert_keys,
                                  delete_share=0.05)
    jobs = [(f"upsert, {MODE[spark]}", upsert_pipeline(env, f"upsert_{i}_{spark}", topic, spark))
            for i in range(args.repeat) for spark in (CONNECT, SUBMIT)]
    planned = [(label, pipeline, env.plan(pipeline)) for label, pipeline in jobs]
    ranges = planned[0][2].ranges
    def baseline_round(i: int) -> dict:
        env.tables += [("public", f"{env.prefix}_upsert_baseline_{i}"), ("public", f"{env.prefix}_upsert_baseline_{i}_offsets")]
        return read_row("upsert plain consumer", "consume + json + execute_values upserts per chunk + CAS",
                        upsert_baseline, env, ranges, f"upsert_baseline_{i}")

    base, best = side_by_side(args.repeat, planned, baseline_round, env)
    history_size(env, planned[0][1], planned[0][2].span)
    with_schemas = f"{topic}_with_schemas"
    copy_with_schemas(env, planned[0][2].ranges, with_schemas)
    debezium_s = min(debezium_run(env, with_schemas, planned[0][2].span, planned[0][1].sinks[0].table, i)
                     for i in range(args.repeat))
    for i in range(args.repeat):
        inserted_s, changed_s = upsert_commit(env, args.upsert_commit_keys, f"upsert_commit_{i}")
        commit = row("upsert commit", changed_s, "s", f"{args.upsert_commit_keys:,} changed keys (first commit, all"
                     f" new keys: {inserted_s:.2f} s)", first_commit_s=round(inserted_s, 2))
    return [
        *mode_targets(7, "upsert", planned[0][2].span, base, best),
        (f"7 upsert: kafka-batch run / Debezium JDBC sink >= 1.5, {MODE[CONNECT]}",
         debezium_s / best[f"upsert, {MODE[CONNECT]}"], 1.5, ">="),
        (f"7 upsert commit of {args.upsert_commit_keys // 1000}k changed keys (s) <= 2", commit["value"], 2, "<="),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3_000_000, help="the big Spark run (and the reads)")
    parser.add_argument("--small", type=int, default=1_000_000, help="the small Spark run, for the marginal rate")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--many", type=int, default=1000, help="partitions of the many-partition case")
    parser.add_argument("--many-records", type=int, default=100_000)
    parser.add_argument("--commit-rows", type=int, default=100_000)
    parser.add_argument("--fixed-records", type=int, default=1000)
    parser.add_argument("--many-keys-records", type=int, default=1_000_000)
    parser.add_argument("--many-keys-users", type=int, default=5_000_000,
                        help="users the many-keys records are spread over (5M: about 0.9 distinct keys per record)")
    parser.add_argument("--avro-records", type=int, default=3_000_000)
    parser.add_argument("--upsert-records", type=int, default=1_000_000)
    parser.add_argument("--upsert-keys", type=int, default=100_000)
    parser.add_argument("--upsert-commit-keys", type=int, default=100_000)
    parser.add_argument("--after-abort-records", type=int, default=1_000_000)
    parser.add_argument("--scale-records", type=int, default=1_000_000,
                        help="the scale part's big batch, over --many partitions and over 4")
    parser.add_argument("--publish-big", type=int, default=10_000_000,
                        help="the Kafka sink's big batch, for the driver's memory against the small size's")
    parser.add_argument("--pipelines", type=int, default=200, help="pipeline files of the parse part")
    parser.add_argument("--concurrent", type=int, default=20, help="pipelines started together (concurrent part)")
    parser.add_argument("--concurrent-records", type=int, default=20_000,
                        help="records added to each topic of the concurrent part before each round")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of each part's measures; each figure is its best round")
    parser.add_argument("--curve", default="1000,10000,100000",
                        help="the chart's smaller batch sizes (the json part adds --small and --records)")
    parser.add_argument("--chart", type=Path, default=PROJECT_ROOT / "docs" / "benchmarks.png",
                        help="where the chart of records per second against batch size goes")
    parser.add_argument("--only", help=f"comma-separated parts ({', '.join(PARTS)}); their targets only")
    parser.add_argument("--json", type=Path, default=Path(os.environ.get("KAFKA_BATCH_HOME", PROJECT_ROOT / ".local"))
                        / "bench.json")
    args = parser.parse_args()
    if args.small >= args.records:
        parser.error(f"--small ({args.small}) must be below --records ({args.records}): the marginal rate is their difference")

    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    pipelines = Path(tempfile.mkdtemp(prefix="kafka_batch_bench_"))
    os.environ["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines)
    env = Env(prefix, pipelines)
    print(f"kafka-batch bench {prefix}: {os.cpu_count()} cores, load {load()}", flush=True)
    try:
        return measure(args, env)
    finally:
        delete_topics(env.kafka, prefix)


def measure_json(args: argparse.Namespace, env: Env) -> list[tuple]:
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
    warm_up(env, lambda i: env.pipeline(f"warm_{i}", small_topic, CONNECT))
    warm_up_peers(env, rounds[0]["small"][1].ranges)
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
        CURVE[f"kafka-batch run, {MODE[CONNECT]}"][records] = connect_run["seconds"]
        CURVE[f"kafka-batch run, {MODE[SUBMIT]}"][records] = submit_run["seconds"]
        CURVE["plain consumer process"][records] = plain["value"]
    many_run = spark_run(env, many, many_batch, f"{args.many} partitions")
    few_run = spark_run(env, few, few_batch, "4 partitions")
    return [
        # The samples' execution (Spark Connect) first; spark-submit, for clusters without a server, after.
        # Both sides from their command's start, on the same records.
        (f"1 JSON {small_name}: plain consumer / kafka-batch run >= 1.5, Spark Connect",
         plain_small["value"] / small_connect_run["seconds"], 1.5, ">="),
        (f"1 JSON {big_name}: the same >= 2, Spark Connect", plain_big["value"] / big_connect_run["seconds"], 2, ">="),
        (f"1 JSON {big_name}: the same >= 1.5, spark-submit", plain_big["value"] / big_run["seconds"], 1.5, ">="),
        ("2 spark marginal / raw read >= 0.6, Spark Connect", marginal_connect / raw["value"], 0.6, ">="),
        ("2 same, spark-submit", marginal / raw["value"], 0.6, ">="),
        (f"3 {args.many} partitions / 4 partitions wall time <= 2", many_run["seconds"] / few_run["seconds"], 2, "<="),
        ("6 worker peak RSS big / small <= 1.25", big_run["rss"]["worker"] / max(small_run["rss"]["worker"], 1), 1.25,
         "<="),
        *peer_targets(14, small_name, {MODE[CONNECT]: small_connect_run["seconds"],
                                       MODE[SUBMIT]: small_run["seconds"]}, peer_best, "JSON"),
        *peer_targets(14, big_name, {MODE[CONNECT]: big_connect_run["seconds"],
                                     MODE[SUBMIT]: big_run["seconds"]}, peer_best, "JSON"),
    ]


def measure_curve(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The chart's smaller batches (--curve sizes; the json part adds the small and the big size): at each,
    the pipeline in both modes, every Spark peer and the plain consumer's whole process on the same records
    (JSON page views, --partitions partitions, a topic per size), Spark Connect warmed up first."""
    sizes = [int(n) for n in args.curve.split(",")]
    topics = {}
    for records in sizes:
        topics[records] = f"{env.prefix}_curve_{records}"
        sample_data.ensure_topic(env.kafka, topics[records], args.partitions)
        sample_data.produce_page_views(env.kafka, topics[records], records, seed=15)
    warm_up(env, lambda i: env.pipeline(f"curve_warm_{i}", topics[sizes[-1]], CONNECT))
    warm_up_peers(env, env.plan(env.pipeline("curve_peer_warm", topics[sizes[-1]])).ranges)
    for i in range(args.repeat):
        for records in sizes:
            size = f"{records:,}"
            jobs = {spark: env.pipeline(f"curve_{records}_{i}_{spark}", topics[records], spark) for spark in (CONNECT, SUBMIT)}
            planned = {spark: env.plan(pipeline) for spark, pipeline in jobs.items()}
            for spark, pipeline in jobs.items():
                seconds = spark_run(env, pipeline, planned[spark], f"curve {size}, {MODE[spark]}")["seconds"]
                key = f"kafka-batch run, {MODE[spark]}"
                CURVE[key][records] = min(seconds, CURVE[key].get(records, seconds))
            batch = planned[CONNECT]
            for peer in SPARK_PEERS:
                peer_run(env, peer, size, batch.ranges, batch.span, jobs[CONNECT].sinks[0].table, JSON_COLUMNS)
            plain = plain_process(env, spans(batch.ranges), 1, f"plain consumer process, {size}")
            CURVE["plain consumer process"][records] = plain["value"]
    return []


def draw_chart(path: Path) -> None:
    """Records per second against records per batch, log-log, one line per system (CURVE): where each wins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=110)
    for system, points in sorted(CURVE.items()):
        sizes = sorted(points)
        axes.plot(sizes, [n / points[n] for n in sizes], marker="o", label=system,
                  linestyle="--" if system.startswith("plain") else "-")
    axes.set(xscale="log", yscale="log", xlabel="records per batch", ylabel="records per second (whole command)",
             title=f"A batch of JSON page views, from the command's start ({os.cpu_count()} cores, one machine)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    print(f"chart written to {path}")


def measure_fixed(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The fixed cost of a small batch from the command's start (targets 4 and 11)."""
    [fixed] = fixed_cost(env, args.fixed_records, SUBMIT, args.repeat)
    fixed_connect, _after_idle = fixed_cost(env, args.fixed_records, CONNECT, args.repeat, after_idle_s=IDLE_S)
    plain = plain_process(env, [(f"{env.prefix}_fixed_{CONNECT}", 0, args.fixed_records, 2 * args.fixed_records)],
                          name="plain consumer process, fixed cost's records")
    return [
        ("4 fixed cost (s) <= 10 (idle machine), Spark Connect", fixed_connect["value"], 10, "<="),
        ("4 same, spark-submit", fixed["value"], 10, "<="),
        ("11 fixed cost / plain consumer's process <= 7, Spark Connect", fixed_connect["value"] / plain["value"], 7,
         "<="),
    ]


def _airflow_call(server: Server, token: str, method: str, path: str, body: dict | None = None) -> dict:
    """One call of Airflow's REST API, its JSON answer; an error status raises, naming it."""
    status, text = server.call(method, path, body, token=token)
    if status >= 300:
        raise RuntimeError(f"Airflow answered {status} to {method} {path}: {text[:300]}")
    return json.loads(text or "{}")


def _dag_run(server: Server, token: str, dag_id: str, timeout_s: float = 600) -> dict:
    """Trigger a run of the DAG and wait for its end: {"run": seconds, task id: seconds}."""
    run = _airflow_call(server, token, "POST", f"api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})
    path = f"api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}"
    deadline = time.monotonic() + timeout_s
    while (run := _airflow_call(server, token, "GET", path))["state"] not in ("success", "failed"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{dag_id}: run {run['dag_run_id']} still {run['state']} after {timeout_s:.0f} s")
        time.sleep(0.5)
    if run["state"] != "success":
        raise RuntimeError(f"{dag_id}: run {run['dag_run_id']} failed; see its task logs in the Airflow UI")
    tasks = _airflow_call(server, token, "GET", f"{path}/taskInstances")["task_instances"]
    took = {t["task_id"]: round(t["duration"] or 0.0, 2) for t in tasks}
    started, ended = (datetime.fromisoformat(run[k]) for k in ("start_date", "end_date"))
    return {"run": round((ended - started).total_seconds(), 2), **took}


def measure_airflow(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The fixed cost of a small batch in an Airflow task (target 11's other half): Airflow's scheduler and
    LocalExecutor run the pipeline's DAG as they run the samples', and the execute task's duration as
    Airflow records it is measured (the task parses the DAG file, resolves the connections, runs the
    batch on Spark Connect and commits), with the whole DAG run's (four tasks and the scheduler's turns).
    Airflow is started here on the bench's pipelines, and stopped at the end."""
    base = local_stack.home()
    state = local_stack.read_state(base)
    if local_stack.airflow_running(state):
        print("  airflow: skipped, Airflow is running on the samples' pipelines (`make down`, then `make bench`)")
        return []
    topic = f"{env.prefix}_airflow"
    sample_data.ensure_topic(env.kafka, topic, 1)
    pipeline = env.pipeline("airflow", topic, CONNECT)
    produced = args.fixed_records
    sample_data.produce_page_views(env.kafka, topic, produced, seed=6)
    url = local_stack.start_airflow(base, state, {"KAFKA_BATCH_PIPELINES_DIR": str(env.pipelines)})
    try:
        server = Server(url, *local_stack.airflow_login(base), base / "airflow-api-server.log")
        token = server.token()
        deadline = time.monotonic() + 180
        # The DAG processor's first parse of the DAG file: until then the DAG is not found.
        while (status := server.call("PATCH", f"api/v2/dags/{pipeline.dag_id}", {"is_paused": False},
                                     token=token)[0]) == 404 and time.monotonic() < deadline:
            time.sleep(2)
        if status >= 300:
            raise RuntimeError(f"Airflow answered {status} to unpausing {pipeline.dag_id}; see {server.log}")
        _dag_run(server, token, pipeline.dag_id)  # a new package's first batch starts the session's Python workers
        for n in range(args.repeat):
            sample_data.produce_page_views(env.kafka, topic, args.fixed_records, seed=60 + n)
            produced += args.fixed_records
            settle(idle_pct=30)  # Airflow's own loops keep an idle machine a little busy
            took = _dag_run(server, token, pipeline.dag_id)
            row("fixed cost in an Airflow task, Spark Connect", took["execute"], "s", f"the execute task of a DAG run"
                f" of {args.fixed_records:,} records (Airflow's duration); the run's tasks {took}", tasks=took)
            row("DAG run of a small batch, Spark Connect", took["run"], "s", f"{args.fixed_records:,} records: plan,"
                " execute, report and the scheduler's turns between them", tasks=took)
    finally:
        local_stack.stop_airflow(state)
    best = next(r for r in ROWS if r["name"] == "fixed cost in an Airflow task, Spark Connect")
    plain = plain_process(env, [(topic, 0, produced - args.fixed_records, produced)],
                          name="plain consumer process, Airflow task's records")
    return [("11 same, Airflow's execute task / plain process <= 7", best["value"] / plain["value"], 7, "<=")]


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes every export and keeps nothing: a backend that is up."""

    def do_POST(self):  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def measure_metrics(args: argparse.Namespace, env: Env) -> list[tuple]:
    """A small batch with metrics off, on and on with the backend down, for StatsD and OpenTelemetry,
    in interleaved rounds: a backend that is down must not slow a batch (target 12)."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # receives and drops: a backend that is up
    listener.bind(("127.0.0.1", 0))
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    with socket.socket() as unused:  # a port nobody listens on: an OpenTelemetry collector that is down
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    statsd = {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}
    otel = {"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1"}
    cases = {"metrics off": {}, "metrics on": {**statsd, "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                                               "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1])},
             "metrics backend down": {**statsd, "AIRFLOW__METRICS__STATSD_HOST": "statsd.invalid"},
             "OpenTelemetry on": {**otel, "AIRFLOW__METRICS__OTEL_PORT": str(collector.server_address[1])},
             "OpenTelemetry backend down": {**otel, "AIRFLOW__METRICS__OTEL_PORT": str(closed)}}
    topic = f"{env.prefix}_metrics"
    sample_data.ensure_topic(env.kafka, topic, 1)
    pipeline = env.pipeline("metrics", topic, CONNECT)
    sample_data.produce_page_views(env.kafka, topic, args.fixed_records, seed=4)
    cli_run(pipeline)  # the session's first batch starts its Python workers
    best = {}
    try:
        for n in range(args.repeat):
            for label, variables in cases.items():
                sample_data.produce_page_views(env.kafka, topic, args.fixed_records, seed=40 + n)
                settle()
                seconds, breakdown = cli_run(pipeline, env=variables)
                best[label] = row(f"batch, {label}", seconds, "s", f"kafka-batch run of {args.fixed_records:,}"
                                  f" records, Spark Connect; phases {breakdown}", phases=breakdown)["value"]
    finally:
        listener.close()
        collector.shutdown()
    return [("12 batch with the StatsD backend down / up <= 1.05", best["metrics backend down"] / best["metrics on"],
             1.05, "<="),
            ("12 same, OpenTelemetry", best["OpenTelemetry backend down"] / best["OpenTelemetry on"], 1.05, "<=")]


def measure_commit(args: argparse.Namespace, env: Env) -> list[tuple]:
    for i in range(args.repeat):
        commit = row("commit", commit_rows(env, args.commit_rows, f"commit_{i}"), "s",
                     f"{args.commit_rows:,} distinct contribution rows")
    return [(f"5 commit of {args.commit_rows // 1000}k rows (s) <= 2", commit["value"], 2, "<=")]


def measure_scale(args: argparse.Namespace, env: Env) -> list[tuple]:
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


def topic_totals(env: Env, topic: str) -> dict:
    """Ground truth, independent of the pipeline: scripts/plain_consumer's read_committed read and
    aggregate of the whole topic, {(page, minute): (views, total duration)}."""
    probe = plain_consumer.consumer(env.kafka, [])
    partitions = probe.list_topics(topic, timeout=30).topics[topic].partitions
    ranges = [(topic, p, *probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)) for p in partitions]
    probe.close()
    reader = plain_consumer.consumer(env.kafka, ranges)
    _, totals = plain_consumer.aggregate(plain_consumer.consume(reader, ranges), "page")
    reader.close()
    return {key: tuple(v) for key, v in totals.items()}


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


def measure_concurrent(args: argparse.Namespace, env: Env) -> list[tuple]:
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


PARSE_PROBE = ("import runpy, sys, time; import airflow.sdk, airflow.providers.standard.operators.python;"
               " started = time.perf_counter(); runpy.run_path(sys.argv[1]); print(time.perf_counter() - started)")


def write_definitions(directory: Path, count: int) -> None:
    """COUNT pipeline files: the reference pipeline, each with its own name, topic and table."""
    base = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    for n in range(count):
        raw = {**base, "name": f"p{n:03}", "topics": [f"t{n:03}"],
               "sinks": {"aggregate": {**base["sinks"]["aggregate"], "table": f"t{n:03}"}}}
        (directory / f"p{n:03}.yaml").write_text(yaml.safe_dump(raw))


def measure_parse(args: argparse.Namespace, env: Env) -> list[tuple]:
    """Issue 55's many pipelines: the DAG file over 10 to --pipelines (200) definitions. Its own time in
    a fresh interpreter, Airflow's import not counted, and Airflow's own figure for the file (`airflow
    dags report`: the DagBag parse the DAG processor runs, which also counts the providers' import), on a
    throwaway Airflow home (SQLite)."""
    dag_file = str(PROJECT_ROOT / "dags" / "kafka_batch_pipelines.py")
    own: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="kafka_batch_parse_") as home:
        variables = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                     "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags")}
        airflow = str(Path(sys.executable).parent / "airflow")
        subprocess.run([airflow, "db", "migrate"], env=variables, check=True, capture_output=True)
        for count in sorted({10, 50, 100, args.pipelines}):
            folder = Path(home) / f"pipelines_{count}"
            folder.mkdir()
            write_definitions(folder, count)
            variables["KAFKA_BATCH_PIPELINES_DIR"] = str(folder)
            for _ in range(args.repeat):
                settle()
                probe = subprocess.run([sys.executable, "-c", PARSE_PROBE, dag_file], env=variables, check=True,
                                       capture_output=True, text=True)
                own[count] = row(f"DAG file, {count} pipelines", float(probe.stdout.split()[-1]), "s",
                                 f"{2 * count} DAGs, Airflow's import not counted")["value"]
                report = subprocess.run([airflow, "dags", "report", "-o", "json"], env=variables, check=True,
                                        capture_output=True, text=True).stdout
                parsed = json.loads(report[report.index("[{"):])[0]
                hours, minutes, seconds = parsed["duration"].split(":")
                row(f"dags report, {count} pipelines", float(seconds) + 60 * int(minutes) + 3600 * int(hours), "s",
                    f"Airflow's DagBag parse of the file: {parsed['dag_num']} DAGs, {parsed['task_num']} tasks")
    return [(f"55 DAG file over {args.pipelines} pipeline files <= 1 s", own[args.pipelines], 1, "<=")]


PARTS = {"json": measure_json, "fixed": measure_fixed, "airflow": measure_airflow, "metrics": measure_metrics,
         "commit": measure_commit, "upsert": measure_upsert, "many-keys": measure_many_keys, "avro": measure_avro,
         "after-abort": measure_after_abort, "kafka-sink": measure_kafka_sink, "curve": measure_curve,
         "scale": measure_scale, "parse": measure_parse, "concurrent": measure_concurrent}


def measure(args: argparse.Namespace, env: Env) -> int:
    parts = args.only.split(",") if args.only else list(PARTS)
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"--only: no part {', '.join(sorted(unknown))} (parts: {', '.join(PARTS)})")
    targets = [target for part in parts for target in PARTS[part](args, env)]
    print(f"\n{'measure (best of its rounds)':<40} {'value':>14}  {'unit':<10} {'rounds':>6}  load\n" + "-" * 92)
    for r in ROWS:
        print(f"{r['name']:<40} {r['value']:>14,.2f}  {r['unit']:<10} {len(r['samples']):>6}  {r['load']}")
    print(f"\n{'target':<58} {'ratio':>8}  result\n" + "-" * 78)
    results = []
    for name, value, limit, op in targets:
        ok = value >= limit if op == ">=" else value <= limit
        results.append({"target": name, "value": round(value, 3), "pass": ok})
        print(f"{name:<58} {value:>8.2f}  {'PASS' if ok else 'FAIL'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "parts": parts,
                                     "cores": os.cpu_count(), "measures": ROWS, "targets": results,
                                     "curve": CURVE},
                                    indent=2, default=str))
    print(f"\nwritten to {args.json}")
    if CURVE:
        draw_chart(args.chart)

    conn = database.connect(env.postgres)
    with conn, conn.cursor() as cur:
        for schema, table in env.tables:
            cur.execute(f'DROP TABLE IF EXISTS "{schema}"."{table}"')
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
