"""Strikes: holding a run at the moment a fault must land in (gates on its Postgres transaction, its process
group stopped inside the Kafka sink's transaction), and the faults themselves beyond a kill of the group
(a Spark task's worker killed, retention overtaking a plan)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import yaml
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_batch_dev import gates
from kafka_batch_dev.chaos.harness import (
    APP,
    batch_of,
    broker_groups,
    finish,
    kafka_bootstrap,
    kill_group,
    open_transaction,
    pg_params,
    python_workers,
    resume,
    sql,
    start_run,
    tasks_running,
    wait_for,
)
from kafka_batch_dev.chaos.truth import Memory
from kafka_batch_dev.gates import LockGate


def lock_gate(table: str) -> LockGate:
    """A gate on one of the pipeline's tables, watching the pipeline's sessions."""
    return LockGate(pg_params(), table, APP)


def published_gate(pipeline: str) -> LockGate:
    """A gate at the pipeline's Postgres COMMIT: after its Kafka sink's transaction committed."""
    return gates.commit_gate(pg_params(), pipeline, APP)


def drop_published_gate(gate: LockGate) -> None:
    sql(f"DROP TRIGGER {gate.table.split('.')[1]} ON kafka_batch.batches")


def kill_published(pipeline: str, run_id: str, env: dict, also=lambda: None) -> bool:
    """A run killed after its Kafka sink's transaction committed and before its Postgres commit did (`also`
    struck first, at that moment); False if the run ended before it got there."""
    gate = published_gate(pipeline)
    try:
        proc = start_run(pipeline, run_id, env)
        if not wait_for("commit", pipeline, run_id, proc, gate=gate):
            return False
        also()
        kill_group(proc)
        # Its COMMIT is in Postgres already, waiting at the gate: it would go on once the gate opens (a
        # backend does not notice its client is gone). Ending the session aborts it.
        gate.terminate_waiting()
        return True
    finally:
        gate.open()
        drop_published_gate(gate)
        finish(proc)


def stage_gate(pipeline: str, run_id: str, proc: subprocess.Popen, timeout: float = 240) -> LockGate | None:
    """A gate on the rows sink's staging table of the run's attempt, as soon as the table exists (its
    retried task must replace, not add to, what a killed try wrote); None if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        batch = batch_of(pipeline, run_id)
        if batch is not None and batch[2] >= 1:
            table = f"kafka_batch_stage.b{batch[0]}_a{batch[2]}_rows"
            if sql("SELECT to_regclass(%s)", table)[0][0] is not None:
                return lock_gate(table)
        time.sleep(0.01)
    return None


def stop_inside_publish(pipeline: str, run_id: str, tables: dict[str, str], proc: subprocess.Popen) -> bool:
    """The run's process group stopped while the Kafka sink's transaction is open on its topic (the
    two steps below: shape rows opened it in the read, so it is open at the commit already; a changelog
    opens it in the commit, after the gate); False if the run never got there, its group continuing."""
    return (stop_before_publish(pipeline, run_id, tables["aggregate"], proc)
            and step_into_transaction(tables["kafka"], proc))


def stop_before_publish(pipeline: str, run_id: str, aggregate: str, proc: subprocess.Popen) -> bool:
    """Stop the run's process group in its commit, before the publish (which comes last): held at a gate
    on the aggregate table, stopped, the gate opened. False if the run ended first."""
    gate = lock_gate(aggregate)
    try:
        if not wait_for("commit", pipeline, run_id, proc, gate=gate):
            return False
        os.killpg(proc.pid, signal.SIGSTOP)
        return True
    finally:
        gate.open()


def step_into_transaction(output: str, proc: subprocess.Popen, slice_s: float = 0.001, timeout: float = 120) -> bool:
    """The stopped group and the broker take turns: the group runs for `slice_s` while the broker is
    stopped, then the broker runs (the group stopped) and answers what the group sent, and the output topic
    is asked whether the Kafka sink's transaction is open on it. A transaction's records are appended in a
    broker's turn and its commit can be asked for only in a later turn of the group (after their
    acknowledgements), so an open transaction is seen however short it is. True: open, the group stopped;
    False: the run ended without one, the group continuing."""
    opened = False
    try:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
        partitions = sorted(admin.list_topics(output, timeout=30).topics[output].partitions)
        brokers = broker_groups()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if open_transaction(admin, output, partitions):
                opened = True
                return True
            for broker in brokers:
                os.killpg(broker, signal.SIGSTOP)
            try:
                os.killpg(proc.pid, signal.SIGCONT)
                time.sleep(slice_s)
                os.killpg(proc.pid, signal.SIGSTOP)
            finally:
                for broker in brokers:
                    os.killpg(broker, signal.SIGCONT)
            time.sleep(0.005)  # the broker's turn: it answers what the group sent before it is asked
    except ProcessLookupError:  # it ended during its turn
        pass
    finally:
        if not opened:
            resume(proc)  # never left stopped, whatever went wrong here
    return False


def kill_a_task(proc: subprocess.Popen, rng: random.Random) -> bool:
    """SIGKILL one Python worker once the run has them: the task it runs fails and Spark retries it."""
    while workers := tasks_running(proc):
        time.sleep(rng.uniform(0, 0.5))
        try:
            rng.choice(workers).kill()
            return True
        except psutil.NoSuchProcess:
            continue
    return False


def kill_a_staging_task(proc: subprocess.Popen, gate: LockGate, timeout: float = 120) -> bool:
    """SIGKILL the Python worker whose COPY waits at the gate (found by its session's client port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        ports = gate.waiting()
        for worker in python_workers(proc) if ports else []:
            try:
                if any(c.laddr and c.laddr.port in ports for c in worker.net_connections(kind="tcp")):
                    worker.kill()
                    return True
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.02)
    return False


def lost_tasks(log_dir: Path) -> int:
    """Task failures Spark reports in the run's log (each one retried, up to the master's limit)."""
    return sum(log.read_text(errors="replace").count("Lost task") for log in log_dir.glob("*.log"))


def delete_in_plan(pipeline: str, topic: str, run_id: str, rng: random.Random, memory: Memory) -> bool:
    """Retention overtakes the batch's plan: delete a random prefix of one of its planned ranges,
    after reading (independently) what is about to go."""
    planned = sql("SELECT r.partition, r.from_offset, r.until_offset FROM kafka_batch.batch_ranges r"
                  " JOIN kafka_batch.batches b ON b.id = r.batch_id WHERE b.pipeline = %s AND b.run_id = %s",
                  pipeline, run_id)
    if not planned:
        return False
    partition, lo, hi = rng.choice(planned)
    cut = rng.randint(lo + 1, hi)
    memory.remember(topic, {partition: cut})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
    for future in admin.delete_records([TopicPartition(topic, partition, cut)]).values():
        future.result()
    memory.deleted_until[partition] = max(cut, memory.deleted_until.get(partition, 0))
    return True


def set_data_loss_policy(path: Path, policy: str) -> None:
    """What an operator does to accept a loss (`skip`) and to go back to refusing one (`fail`)."""
    definition = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**definition, "on_data_loss": policy}, sort_keys=False))
