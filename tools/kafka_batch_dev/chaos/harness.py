"""The suite's harness: the services it runs against, the pipeline's runs, and the phases a run is seen in.

Everything the scenarios, the soak and the checker share: the connections (from the environment `make up`
writes), SQL on the pipeline's Postgres, starting a run and killing or resuming its process group, where
a batch is (from Postgres), the lag and the fault-free recovery after a strike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg2
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_batch_dev import local_stack
from kafka_batch_dev.gates import LockGate

APP = "kafka_batch_chaos"  # application_name of every session the pipeline opens here
PAGES = ["/", "/a", "/b", "/c", "/d"]
RECOVERY_BOUND_S = 300
# A struck run ends well within this: a batch's attempt is bounded by its own timeouts (the execute task's
# default is 10 minutes for these pipelines' sizes); a run still going after it has hung.
RUN_BOUND_S = 900
CLI = str(Path(sys.executable).parent / "kafka-batch")  # the pipeline's CLI, from this venv
TASK_TRIES = 4  # spark.task.maxFailures of the task-retry scenario (the master `local[2,4]`)


@dataclass
class Outcome:
    iterations: int = 0
    faults: Counter = field(default_factory=Counter)
    records: int = 0
    violations: list[str] = field(default_factory=list)
    worst_recovery_s: float = 0.0


# --- services ---------------------------------------------------------------------------------------

def kafka_bootstrap() -> str:
    return json.loads(os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"]


# The local home whose services the restarts stop and start (`--services-home`; default: `kafka-batch local`'s).
SERVICES_HOME: Path | None = None


def restart(service: str, kill: bool = False) -> None:
    local_stack.restart(service, SERVICES_HOME, kill=kill)


def broker_groups() -> list[int]:
    """The process groups of the local cluster's running nodes (one, or three)."""
    return list(local_stack.kafka_node_pids(local_stack.read_state(services_home())).values())


def services_home() -> Path:
    return SERVICES_HOME or local_stack.home()


def kafka_nodes() -> list[int]:
    """The ids of the local cluster's nodes."""
    return [node.id for node in local_stack.kafka_nodes(local_stack.read_state(services_home()))]


def kill_node(node: int) -> None:
    """SIGKILL one node of the local cluster, as a host that dies."""
    local_stack.kill_kafka_node(services_home(), node)


def revive_nodes() -> None:
    """Start again every node of the local cluster that is down."""
    local_stack.revive_kafka(services_home())


def leader(topic: str, partition: int) -> int:
    """The node leading a partition, as the cluster's metadata says (-1: none now)."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
    return admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader


def active_controller() -> int:
    """The node leading the controllers' quorum (-1: none elected within a minute)."""
    return local_stack.active_controller(services_home())


def transaction_coordinator(transactional_id: str) -> int:
    """The node coordinating a transactional id: the leader of its partition of __transaction_state."""
    from kafka_batch_dev.kafka_broker import coordinator_partition

    return leader("__transaction_state", coordinator_partition(transactional_id))


def pg_params() -> dict:
    conn = json.loads(os.environ["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
    return {"host": conn["host"], "port": conn["port"], "user": conn.get("login"), "dbname": conn["schema"],
            **({"password": conn["password"]} if conn.get("password") else {})}


def sql(statement: str, *params) -> list[tuple]:
    conn = psycopg2.connect(**pg_params())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def chaos_environment() -> dict[str, str]:
    """The pipeline's sessions carry an application name, so faults can find them."""
    env = os.environ.copy()
    conn = json.loads(env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
    conn["extra"] = {**conn.get("extra", {}), "application_name": APP}
    env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"] = json.dumps(conn)
    return env


def run_environment(env: dict[str, str], spark: str, option: str) -> dict[str, str]:
    """The pipelines' environment for runs that reach Spark as `option` says (`spark`): through spark-submit
    as they are, or on the local Spark Connect server, their `spark_default` pointing at it."""
    if spark == "spark-submit":
        return env
    if "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT" not in env:
        raise SystemExit(f"{option} spark-connect needs the Spark Connect server: kafka-batch local up starts it")
    return {**env, "AIRFLOW_CONN_SPARK_DEFAULT": env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"]}


def start_run(pipeline: str, run_id: str | None, env: dict) -> subprocess.Popen:
    """`kafka-batch run` in a process group of its own (None: the run id the CLI gives a run)."""
    return subprocess.Popen([CLI, "run", "--pipeline", pipeline, *(["--run-id", run_id] if run_id else [])], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def batch_of(pipeline: str, run_id: str) -> tuple | None:
    rows = sql("SELECT id, status, attempt FROM kafka_batch.batches WHERE pipeline = %s AND run_id = %s",
               pipeline, run_id)
    return rows[0] if rows else None


def in_commit(pipeline: str) -> bool:
    """A session of the pipeline holds an open transaction that writes positions or outputs."""
    return bool(sql("SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL"
                    " AND (query ILIKE '%%kafka_batch.offsets%%' OR query ILIKE 'INSERT INTO %%')", APP))


def wait_for(phase: str, pipeline: str, run_id: str, proc: subprocess.Popen, timeout: float = 240,
             gate: LockGate | None = None) -> bool:
    """Block until the run reaches `phase` (or ends); True if the fault can land in that phase."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        batch = batch_of(pipeline, run_id)
        if phase == "starting" and batch is not None:
            return True
        if phase == "reading" and batch is not None and batch[2] >= 1 and batch[1] in ("planned", "failed"):
            return True
        if phase == "commit" and (bool(gate.waiting()) if gate is not None else in_commit(pipeline)):
            return True
        if phase == "after-commit" and batch is not None and batch[1] == "committed":
            return True
        time.sleep(0.01 if phase == "commit" else 0.1)
    return False


def end_offsets(admin: AdminClient, topic: str, partitions, committed: bool = True) -> dict[int, int]:
    """Per partition, where a reader ends: the last stable offset (`committed`), else the high watermark."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                 isolation_level=level, request_timeout=30)
    return {tp.partition: f.result(timeout=45).offset for tp, f in futures.items()}  # its request's 30 s and a grace


def open_transaction(admin: AdminClient, topic: str, partitions: list[int]) -> bool:
    """Some partition of the topic has a last stable offset below its end: a transaction is open on it."""
    stable, end = end_offsets(admin, topic, partitions), end_offsets(admin, topic, partitions, committed=False)
    return any(stable[p] < end[p] for p in partitions)


def resume(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


class RunHung(Exception):
    """A run of the pipeline outlasted RUN_BOUND_S: a violation of "nothing waits forever"."""


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def finish(proc: subprocess.Popen, bound: float = RUN_BOUND_S) -> int:
    """The run's exit code once it ends; past `bound` it is killed and RunHung raised."""
    try:
        return proc.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        command = " ".join(map(str, proc.args[1:]))
        raise RunHung(f"a run ({command}, pid {proc.pid}) did not end within {bound:g} s") from None


def terminate_sessions() -> int:
    return len(sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", APP))


def python_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The run's Python workers: the processes pyspark's daemon forks for tasks (not the daemon)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    workers = []
    for child in family:
        try:
            if "pyspark.daemon" in " ".join(child.cmdline()) and "pyspark.daemon" in " ".join(child.parent().cmdline()):
                workers.append(child)
        except (psutil.NoSuchProcess, AttributeError):  # gone, or its parent is
            continue
    return workers


def tasks_running(proc: subprocess.Popen, timeout: float = 120) -> list[psutil.Process]:
    """Wait until the run's Spark tasks run (its Python workers exist); [] if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        workers = python_workers(proc)
        if workers:
            return workers
        time.sleep(0.02)
    return []


def lag(pipeline: str, topic: str) -> int:
    """Last stable offsets (asked here, not through the pipeline's code) minus the stored positions."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
    ends = end_offsets(admin, topic, admin.list_topics(topic, timeout=30).topics[topic].partitions)
    positions = {p: o for p, o in sql("SELECT partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s",
                                      pipeline)}
    return sum(end - positions.get(p, 0) for p, end in ends.items())


def recover(pipeline: str, topic: str, env: dict) -> float:
    """Runs without faults until the lag is zero; returns how long it took."""
    started = time.monotonic()
    while time.monotonic() - started < RECOVERY_BOUND_S:
        if lag(pipeline, topic) == 0:
            return time.monotonic() - started
        try:
            finish(start_run(pipeline, None, env), max(1.0, RECOVERY_BOUND_S - (time.monotonic() - started)))
        except RunHung:  # killed with its processes: the lag is not zero within the bound
            break
    return float("inf")


def until(found, timeout: float = 10.0):
    """What `found()` returns once it is truthy, polled for up to `timeout` seconds (else its last answer)."""
    deadline = time.monotonic() + timeout
    while not (answer := found()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer
