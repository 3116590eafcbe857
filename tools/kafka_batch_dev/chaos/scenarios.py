"""The scenarios: each strikes one batch once, in the phase it names (`scenario`)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from confluent_kafka.admin import AdminClient

from kafka_batch.errors import DataLossError
from kafka_batch.kafka.publish import transactional_id
from kafka_batch_dev.chaos.harness import (
    CLI,
    TASK_TRIES,
    active_controller,
    batch_of,
    finish,
    kafka_bootstrap,
    kafka_nodes,
    kill_group,
    kill_node,
    leader,
    open_transaction,
    restart,
    resume,
    revive_nodes,
    start_run,
    tasks_running,
    terminate_sessions,
    transaction_coordinator,
    wait_for,
)
from kafka_batch_dev.chaos.strikes import (
    delete_in_plan,
    drop_published_gate,
    kill_a_staging_task,
    kill_a_task,
    kill_published,
    lock_gate,
    lost_tasks,
    published_gate,
    set_data_loss_policy,
    stage_gate,
    stop_inside_publish,
)
from kafka_batch_dev.chaos.truth import Memory


def scenario(name: str, pipeline: str, topic: str, run_id: str, env: dict, rng: random.Random,
             tables: dict[str, str], memory: Memory, definition: Path) -> Counter:
    """Strike once; returns what landed, by phase."""
    landed: Counter = Counter()
    if name == "kill-published":  # the Kafka sink's transaction committed, the Postgres one not yet
        if kill_published(pipeline, run_id, env):
            landed["published"] += 1
    elif name == "kill-producing":  # SIGKILL inside the Kafka sink's transaction, its messages produced
        proc = start_run(pipeline, run_id, env)
        if stop_inside_publish(pipeline, run_id, tables, proc):
            kill_group(proc)
            landed["producing"] += 1
        finish(proc)
    elif name.startswith("kill-"):
        phase = name.removeprefix("kill-")
        gate = lock_gate(tables["aggregate"]) if phase == "commit" else None
        try:
            proc = start_run(pipeline, run_id, env)
            if wait_for(phase, pipeline, run_id, proc, gate=gate):
                kill_group(proc)
                landed[phase] += 1
        finally:
            if gate is not None:
                gate.open()
        finish(proc)
    elif name == "zombie":  # the Airflow task dies, its spark-submit lives on; the task is retried
        proc = start_run(pipeline, run_id, env)
        if wait_for("reading", pipeline, run_id, proc):
            os.kill(proc.pid, signal.SIGKILL)  # the CLI only; spark-submit and the JVM run on
            landed["zombie"] += 1
            retry = start_run(pipeline, run_id, env)
            finish(retry)
        time.sleep(2)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the zombie is left
        except ProcessLookupError:
            pass
    elif name.startswith("terminate-"):
        phase = name.removeprefix("terminate-")
        proc = start_run(pipeline, run_id, env)
        if phase == "random":  # a random moment at which the pipeline has a session to lose
            time.sleep(rng.uniform(0, 20))
            while proc.poll() is None:
                if terminate_sessions():
                    landed["random"] += 1
                    break
                time.sleep(0.05)
        else:
            gate = lock_gate(tables["aggregate"])
            try:
                if wait_for("commit", pipeline, run_id, proc, gate=gate) and terminate_sessions():
                    landed["commit"] += 1
            finally:
                gate.open()
        finish(proc)
    elif name == "race":
        runs = [start_run(pipeline, f"{run_id}-{n}", env) for n in range(2)]
        for proc in runs:
            finish(proc)
        landed["race"] += 1
    elif name == "replay-race":
        replay = subprocess.Popen([CLI, "replay", "--pipeline", pipeline, "--topic", topic, "--from", "0",
                                   "--until", "1000000000", "--run-id", f"{run_id}-replay"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        proc = start_run(pipeline, run_id, env)
        finish(replay)
        finish(proc)
        landed["replay-race"] += 1
    elif name == "pg-restart":
        proc = start_run(pipeline, run_id, env)
        if wait_for("reading", pipeline, run_id, proc):
            restart("postgres")
            landed["reading"] += 1
        finish(proc)
    elif name in ("broker-restart", "broker-kill"):  # between batches: stopped cleanly, or SIGKILLed
        restart("kafka", kill=name == "broker-kill")
        landed["between"] += 1
    elif name == "broker-kill-reading":  # the node SIGKILLed while the batch's tasks read from it
        proc = start_run(pipeline, run_id, env)
        if wait_for("reading", pipeline, run_id, proc):
            restart("kafka", kill=True)
            landed["reading"] += 1
        finish(proc)
    elif name == "broker-kill-publishing":  # the node SIGKILLed while the Kafka sink's transaction is open
        proc = start_run(pipeline, run_id, env)
        if stop_inside_publish(pipeline, run_id, tables, proc):
            try:
                restart("kafka", kill=True)
                landed["publishing"] += 1
            finally:
                resume(proc)
        finish(proc)
    elif name == "broker-kill-published":  # the Kafka sink's transaction committed, the Postgres one not yet
        gate = published_gate(pipeline)
        try:
            proc = start_run(pipeline, run_id, env)
            if wait_for("commit", pipeline, run_id, proc, gate=gate):
                restart("kafka", kill=True)
                landed["published"] += 1
        finally:
            gate.open()
            drop_published_gate(gate)
        finish(proc)
    elif name == "task-retry":  # a Python worker dies mid-task; Spark retries the task (local[2,4])
        phase = rng.choice(["reading", "staging"])  # a read task, or a task COPYing the rows sink's stage
        log_dir = Path(tempfile.mkdtemp(prefix="kafka_batch_chaos_logs_"))
        retrying = {**env, "KAFKA_BATCH_LOG_DIR": str(log_dir), "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {"conn_type": "spark", "host": f"local[2,{TASK_TRIES}]"})}
        proc = start_run(pipeline, run_id, retrying)
        if phase == "reading":
            killed = wait_for("reading", pipeline, run_id, proc) and kill_a_task(proc, rng)
        else:
            gate = stage_gate(pipeline, run_id, proc)
            try:
                killed = gate is not None and kill_a_staging_task(proc, gate)
            finally:
                if gate is not None:
                    gate.open()
        finish(proc)
        batch = batch_of(pipeline, run_id)
        if killed and lost_tasks(log_dir):  # landed in a task, and that attempt went on
            landed[phase if batch and batch[1:] == ("committed", 1) else f"{phase}, batch retried"] += 1
        shutil.rmtree(log_dir, ignore_errors=True)
    elif name.startswith("retention-"):  # on_data_loss is the suffix (the pipeline's setting)
        phase = rng.choice(["planned", "reading"])  # after the plan, or while Spark's tasks read
        proc = start_run(pipeline, run_id, env)
        struck = wait_for("starting", pipeline, run_id, proc) and (phase == "planned" or bool(tasks_running(proc)))
        if struck and delete_in_plan(pipeline, topic, run_id, rng, memory):
            landed[phase] += 1
        if finish(proc) == DataLossError.exit_code and name == "retention-fail":
            # Refused, nothing changed; the operator accepts the loss for one run, then refuses again.
            set_data_loss_policy(definition, "skip")
            finish(start_run(pipeline, None, env))
            set_data_loss_policy(definition, "fail")
            landed["refused, then accepted"] += 1
    elif name.startswith("node-") or name == "controller-kill":
        landed = node_scenario(name, pipeline, topic, run_id, env, tables)
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    return landed


def node_scenario(name: str, pipeline: str, topic: str, run_id: str, env: dict, tables: dict[str, str]) -> Counter:
    """A node of a three-node cluster SIGKILLed, as a host that dies, in a batch's phase; every node down
    is started again once the run has ended (the recovery then runs on the whole cluster)."""
    if len(kafka_nodes()) < 3:
        raise SystemExit(f"scenario {name!r} needs a three-node cluster: make down && make clean && make up KAFKA_NODES=3")
    landed: Counter = Counter()
    try:
        if name == "node-kill-reading":  # the leader of an input partition, while the batch's tasks read it
            proc = start_run(pipeline, run_id, env)
            if wait_for("reading", pipeline, run_id, proc) and tasks_running(proc):
                kill_node(leader(topic, 0))
                landed["reading"] += 1
            finish(proc)
        elif name == "node-kill-publishing":  # the transaction coordinator's node, the transaction open
            tid = transactional_id(pipeline, tables["kafka"])
            proc = start_run(pipeline, run_id, env)
            admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
            partitions = sorted(admin.list_topics(tables["kafka"], timeout=30).topics[tables["kafka"]].partitions)
            while proc.poll() is None:
                if open_transaction(admin, tables["kafka"], partitions):
                    kill_node(transaction_coordinator(tid))
                    landed["publishing"] += 1
                    break
                time.sleep(0.01)
            finish(proc)
        elif name == "node-kill-published":  # the coordinator's node, between the Kafka and the Postgres commit
            tid = transactional_id(pipeline, tables["kafka"])
            if kill_published(pipeline, run_id, env, also=lambda: kill_node(transaction_coordinator(tid))):
                landed["published"] += 1
        elif name == "controller-kill":  # the quorum's leader, as the batch is planned
            kill_node(active_controller())
            finish(start_run(pipeline, run_id, env))
            landed["planning"] += 1
    finally:
        revive_nodes()
    return landed


SCENARIOS = ["kill-starting", "kill-reading", "kill-commit", "kill-producing", "kill-published", "kill-after-commit",
             "zombie", "terminate-random", "terminate-commit", "race", "replay-race", "pg-restart", "broker-restart",
             "broker-kill", "task-retry", "retention-skip", "retention-fail", "kill-reading:avro", "broker-kill-reading",
             "broker-kill-publishing", "broker-kill-published"]
# Strikes on the driver's commit alone: under Spark Connect the CLI is the driver and commits, so they land
# the same there (`--strike-on spark-connect`). The others strike the run's Spark processes (its workers,
# a spark-submit that outlives the CLI, a group stopped mid-publish), which only spark-submit puts in the
# run's process group.
DRIVER_STRIKES = {"kill-commit", "kill-published", "kill-after-commit", "terminate-commit"}
# On a three-node cluster (make up KAFKA_NODES=3): a node SIGKILLed in a batch's phase.
CLUSTER_SCENARIOS = ["node-kill-reading", "node-kill-publishing", "node-kill-published", "controller-kill"]
