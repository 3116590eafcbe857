"""Test helpers: pipelines on fresh topics, and ground truth read straight from the topic.

The ground truth uses a plain consumer and Python's json, not the project's reader or transform,
so a test compares our results against something our code did not compute.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import yaml
from confluent_kafka import Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_batch import connections
from kafka_batch.config import load_pipeline
from kafka_batch_dev import sample_data
from kafka_batch_dev.committed import client_settings, committed_messages

ROOT = Path(__file__).resolve().parents[2]


def kafka_config() -> dict:
    return connections.kafka_config(connections.from_environment("kafka_default"))


def pg_connect():
    conn = psycopg2.connect(**connections.postgres_params(connections.from_environment("kafka_batch_postgres")))
    conn.autocommit = True
    return conn


def admin_client(config: dict | None = None) -> AdminClient:
    """A plain admin client for the tests' own checks and setup (not the project's KafkaOffsets), on the
    cluster of `config` (the session's by default)."""
    return AdminClient(client_settings(config or kafka_config()))


def create_topic(topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
    """Create the topic (it must be new; replicas: the cluster's default) and wait until the broker's metadata
    has all its partitions."""
    admin = admin_client()
    for future in admin.create_topics([NewTopic(topic, partitions, config=config or {})]).values():
        future.result()
    sample_data.wait_for_topic(admin, topic, partitions)


# A topic the log cleaner compacts within seconds: segments close after a second (at the next append) and
# are cleaned as soon as anything in them is dirty.
COMPACTED = {"cleanup.policy": "compact", "segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01",
             "min.compaction.lag.ms": "0"}
CLEANER_WAIT_S = 90


def compact(topic: str) -> dict[int, int]:
    """Close every partition's active segment and wait for the log cleaner to compact what lies before it:
    each partition's last committed record is appended again after a second (the append rolls the segment;
    the latest record of each key stays what it was), then the topic is read until no key appears twice
    below those appends. Returns where each partition's uncleaned part begins."""
    last = {m.partition(): m for m in _committed_messages(topic, _partitions(topic))}
    time.sleep(1.5)  # past segment.ms
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "enable.idempotence": True})
    rolled: dict[int, int] = {}
    for partition, message in last.items():
        producer.produce(topic, key=message.key(), value=message.value(), partition=partition,
                         on_delivery=lambda error, m: rolled.__setitem__(m.partition(), m.offset()))
    assert producer.flush(30) == 0 and len(rolled) == len(last)
    deadline = time.monotonic() + CLEANER_WAIT_S
    while True:
        seen = Counter((m.partition(), m.key()) for m in _committed_messages(topic, _partitions(topic))
                       if m.offset() < rolled[m.partition()])
        if all(count == 1 for count in seen.values()):
            return rolled
        assert time.monotonic() < deadline, f"the log cleaner did not compact {topic} within {CLEANER_WAIT_S} s"
        time.sleep(1)


# A rows sink of every page view: what tests compare with the topic record by record.
ROWS_SINK = {"columns": {"user_id": "user_id", "page": "page", "duration_ms": {"expr": "duration_ms", "type": "bigint"},
                         "viewed_at": {"expr": "timestamp", "type": "timestamptz"}}}


def new_pipeline(prefix: str, partitions: int = 3, rows: bool = False, spark_submit: bool = False, **overrides):
    """A page-views pipeline on a new topic with its own table (and a rows sink, with `rows`).

    Its batches run on the tests' Spark Connect server (one JVM, warm Python workers: seconds per batch),
    or through spark-submit, the default execution, with `spark_submit` (tests of that path).
    """
    suffix = uuid.uuid4().hex[:8]
    name = f"{prefix}_{suffix}"
    definition = yaml.safe_load((ROOT / "pipelines" / "page_views.yaml").read_text())
    definition.update(name=name, topics=[f"{name}_topic"], schedule=None)
    spark = "spark_default" if spark_submit else os.environ["KAFKA_BATCH_TEST_SPARK_CONN"]
    definition["connections"] = {**definition.get("connections", {}), "spark": spark}
    definition["sinks"]["aggregate"]["table"] = f"{name}_minutes"
    if rows:
        definition["sinks"]["rows"] = {**ROWS_SINK, "table": f"{name}_views"}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(definition.get(key), dict):
            definition[key] = {**definition[key], **value}
        else:
            definition[key] = value
    directory = Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"])
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    if partitions:
        create_topic(f"{name}_topic", partitions)
    return load_pipeline(name)


def _committed_messages(topic: str, partitions: list[int], config: dict | None = None) -> Iterator[Message]:
    """Every committed record of the partitions (tombstones too), from the beginning to the end."""
    return committed_messages(config or kafka_config(), topic, partitions)


def _partitions(topic: str, config: dict | None = None) -> list[int]:
    return sorted(admin_client(config).list_topics(topic, timeout=30).topics[topic].partitions)


def ground_truth(topic: str, select=None, duration_factor: int = 1, config: dict | None = None,
                 messages: list[Message] | None = None) -> dict[tuple[str, datetime], tuple[int, int]]:
    """(page, minute) -> (views, total duration) over every committed record of the topic (on the cluster
    of `config`, the session's by default), or over `messages` read from it earlier.

    `select(partition, offset)` keeps a subset of the records; `duration_factor` is the aggregation
    changed by a test (duration_ms * factor).
    """
    views: Counter = Counter()
    durations: Counter = Counter()
    for message in _committed_messages(topic, _partitions(topic, config), config) if messages is None else messages:
        if message.value() is None or (select is not None and not select(message.partition(), message.offset())):
            continue
        record = json.loads(message.value())
        _, ts = message.timestamp()
        minute = datetime.fromtimestamp(ts // 60_000 * 60, tz=UTC)
        views[(record["page"], minute)] += 1
        durations[(record["page"], minute)] += record["duration_ms"] * duration_factor
    return {key: (views[key], durations[key]) for key in views}


def query(statement: str, *params) -> list[tuple]:
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute(statement, params)
        rows = cur.fetchall()
    conn.close()
    return rows


def sink_table(pipeline, kind: str) -> str:
    return next(sink.table for sink in pipeline.sinks if sink.kind == kind)


def aggregate_table(pipeline) -> str:
    return sink_table(pipeline, "aggregate")


def table_contents(pipeline) -> dict[tuple[str, datetime], tuple[int, int]]:
    """The aggregate sink's totals: (page, minute) -> (views, total duration)."""
    rows = query(f"SELECT page, minute, views, total_duration_ms FROM {aggregate_table(pipeline)}")
    return {(page, minute): (views, duration) for page, minute, views, duration in rows}


def rows_contents(pipeline) -> dict[tuple[str, int, int], tuple]:
    """The rows sink: (topic, partition, offset) -> (user_id, page, duration_ms, viewed_at)."""
    rows = query(f"SELECT kafka_topic, kafka_partition, kafka_offset, user_id, page, duration_ms, viewed_at"
                 f" FROM {sink_table(pipeline, 'rows')}")
    return {tuple(r[:3]): tuple(r[3:]) for r in rows}


def rows_truth(topic: str, select=None, messages: list[Message] | None = None) -> dict[tuple[str, int, int], tuple]:
    """What the rows sink must hold: every committed non-tombstone record (of `messages` read from the
    topic earlier, if given), parsed with json here."""
    truth = {}
    for message in _committed_messages(topic, _partitions(topic)) if messages is None else messages:
        if message.value() is None or (select is not None and not select(message.partition(), message.offset())):
            continue
        record = json.loads(message.value())
        viewed_at = datetime.fromtimestamp(message.timestamp()[1] / 1000, tz=UTC)
        truth[(topic, message.partition(), message.offset())] = (
            record["user_id"], record["page"], record["duration_ms"], viewed_at)
    return truth


def positions(pipeline_name: str) -> dict[tuple[str, int], int]:
    rows = query("SELECT topic, partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s", pipeline_name)
    return {(t, p): o for t, p, o in rows}


def batches_of(pipeline_name: str) -> list[tuple]:
    """(id, kind, status, run_id, records_read, error) of each batch, oldest first."""
    return query(
        "SELECT id, kind, status, run_id, records_read, error FROM kafka_batch.batches WHERE pipeline = %s ORDER BY id",
        pipeline_name,
    )


def _checked(result: subprocess.CompletedProcess, what: str, check: bool) -> subprocess.CompletedProcess:
    """The result, or with `check` an AssertionError showing the command's exit code and output tails."""
    if check and result.returncode != 0:
        raise AssertionError(f"{what} failed (exit {result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def run_dag(dag_id: str, logical_date: str, run_after: str | None = None, check: bool = True,
            **conf) -> subprocess.CompletedProcess:
    """One DAG run through Airflow (`dag.test()`, tests/airflow/run_dag.py), in a DAG-run server
    process that outlives it (Airflow's start is paid once per session); stdout holds the run's output."""
    args = [dag_id, logical_date, json.dumps(conf), *([run_after] if run_after else [])]
    env = os.environ.copy()
    output = Path(env["KAFKA_BATCH_LOG_DIR"]) / "dag-runs" / f"{uuid.uuid4().hex}.log"  # searched for the secret
    output.parent.mkdir(parents=True, exist_ok=True)
    runner = _dag_runner(env)
    runner.stdin.write(json.dumps({"args": args, "env": env, "output": str(output)}) + "\n")
    runner.stdin.flush()
    reply = runner.stdout.readline()
    returncode = json.loads(reply)["returncode"] if reply else runner.wait()  # no reply: the server died
    text = output.read_text() if output.exists() else ""
    result = subprocess.CompletedProcess(["run_dag", *args], returncode, text, "")
    return _checked(result, f"run_dag {dag_id} {logical_date} {conf}", check)


_dag_runners: dict[frozenset, subprocess.Popen] = {}


def _dag_runner(env: dict[str, str]) -> subprocess.Popen:
    """The DAG-run server for these Airflow settings (Airflow reads some, like the DAGs folder, at import)."""
    key = frozenset((k, v) for k, v in env.items() if k.startswith("AIRFLOW__") or k == "AIRFLOW_HOME")
    runner = _dag_runners.get(key)
    if runner is None or runner.poll() is not None:
        if not _dag_runners:
            atexit.register(_stop_dag_runners)
        runner = subprocess.Popen([sys.executable, "-m", "tests.airflow.run_dag", "--serve"], cwd=ROOT, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        _dag_runners[key] = runner
    return runner


def _stop_dag_runners() -> None:
    for runner in _dag_runners.values():
        runner.stdin.close()  # the server ends at the end of its input
        try:
            runner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            runner.kill()


@contextmanager
def airflow_alone() -> Iterator[None]:
    """The session's Airflow to this process alone, while it runs DAGs (dag.test(), or a scheduler).

    pytest-xdist workers share one Airflow metadata database: a scheduler (the console tests) would take
    over the task instances of another worker's dag.test() run and consume the asset queues a test checks.
    """
    path = Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]).parent / "airflow-runs.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_airflow(*args: str, check: bool = True, env: dict[str, str] | None = None,
                answers: str | None = None) -> subprocess.CompletedProcess:
    """`airflow ...` in a subprocess, with the test services' environment (and `env` over it). `answers`
    go to its prompts through stdin: in a session of its own it has no terminal to ask instead."""
    airflow = str(Path(sys.executable).parent / "airflow")
    result = subprocess.run([airflow, *args], capture_output=True, text=True, env={**os.environ, **(env or {})},
                            input=answers, start_new_session=answers is not None, timeout=600)
    return _checked(result, f"airflow {' '.join(args)}", check)


def run_cli(*args: str, check: bool = True, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`kafka-batch ...` in a subprocess, with the test services' environment (and `env` over it)."""
    cli = str(Path(sys.executable).parent / "kafka-batch")
    result = subprocess.run([cli, *args], capture_output=True, text=True, env={**os.environ, **(env or {})},
                            cwd=cwd, timeout=900)
    outputs = Path(os.environ["KAFKA_BATCH_LOG_DIR"])
    outputs.mkdir(parents=True, exist_ok=True)
    with open(outputs / "cli-output.log", "a") as log:  # searched for the planted secret at the end (conftest)
        log.write(f"$ kafka-batch {' '.join(args)}\n{result.stdout}{result.stderr}")
    return _checked(result, f"kafka-batch {' '.join(args)}", check)


def store_connection():
    """A connection as the project opens it (transactions managed by kafka_batch.core.database)."""
    from kafka_batch.core import database

    return database.connect(connections.postgres_params(connections.from_environment("kafka_batch_postgres")))


def update_pipeline(name: str, **changes):
    """Change a test pipeline's definition in place (as an operator edits its YAML)."""
    path = Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{name}.yaml"
    definition = yaml.safe_load(path.read_text())
    definition.update(changes)
    path.write_text(yaml.safe_dump(definition))
    return load_pipeline(name)


def delete_records(topic: str, partition: int, before: int) -> None:
    """What retention does: the log now starts at `before`."""
    admin = admin_client()
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result()


def merged(*truths: dict) -> dict:
    """Ground truths of disjoint sets of records, added up."""
    total: dict = {}
    for truth in truths:
        for key, (views, duration) in truth.items():
            v, d = total.get(key, (0, 0))
            total[key] = (v + views, d + duration)
    return total


def below(limits: dict[tuple[str, int], int]):
    """A ground-truth selection: the records below the given positions."""
    return lambda partition, offset: offset < next(o for (_, p), o in limits.items() if p == partition)


def count_rows(statement: str, *params) -> int:
    [(count,)] = query(statement, *params)
    return count


def records_by_partition(topic: str) -> dict[int, list[tuple[int, int]]]:
    """partition -> [(offset, timestamp ms)] of every committed record, read with a plain consumer."""
    partitions = _partitions(topic)
    found: dict[int, list[tuple[int, int]]] = {p: [] for p in partitions}
    for message in _committed_messages(topic, partitions):
        found[message.partition()].append((message.offset(), message.timestamp()[1]))
    return found


def committed_records(topic: str) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    """(partition, offset, key, value, timestamp ms) of every committed record (tombstones too), read
    with a plain read_committed consumer, in offset order per partition."""
    return [(m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1])
            for m in _committed_messages(topic, _partitions(topic))]


@contextmanager
def own_spark_connect(directory: Path, conn_id: str, master: str | None = None,
                      extra: dict | None = None) -> Iterator[dict]:
    """A Spark Connect server of the test's own (local_stack's, on `master` if given, `extra` settings over
    its own), reachable as the connection `conn_id`; its state (port, pid) is yielded, and the server is
    stopped at the end, checked gone."""
    from kafka_batch_dev import local_stack

    server: dict = {}
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    saved = os.environ.get(variable)
    try:
        local_stack.start_spark_connect(directory, server, master, extra)
        os.environ[variable] = json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                           "port": server["spark_connect_port"]})
        yield server
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved
        left = local_stack.stop_spark_connect(server)
        assert not left, f"the Spark Connect server survived SIGKILL: {left}"


def nothing_stored(pipeline) -> None:
    """Nothing of the pipeline in Postgres: no row, no batch, no sink table."""
    assert query("SELECT count(*) FROM kafka_batch.pipelines WHERE name = %s", pipeline.name) == [(0,)]
    assert query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name) == [(0,)]
    assert query("SELECT to_regclass(%s)", f"public.{sink_table(pipeline, 'aggregate')}") == [(None,)]


def one_line_error(result, exit_code: int, *words: str) -> str:
    """A command's error: its exit code and one line on stderr holding `words`, no traceback."""
    assert result.returncode == exit_code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert "%3|" not in result.stderr  # librdkafka's own log lines stay out of the terminal
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr
