"""The soak: producers writing all along, a pipeline per format running batch after batch, and a fault
every few seconds; then the pipelines catch up and the checker runs."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaException

from kafka_batch_dev.chaos.harness import (
    RECOVERY_BOUND_S,
    Outcome,
    RunHung,
    finish,
    kafka_nodes,
    kill_group,
    kill_node,
    recover,
    restart,
    revive_nodes,
    start_run,
    terminate_sessions,
    until,
)
from kafka_batch_dev.chaos.pipeline import create_pipeline
from kafka_batch_dev.chaos.truth import (
    Codec,
    Memory,
    check,
    transactional_producers,
    watch_positions,
    write_transaction,
)

# --- the soak: everything at once, for minutes ---------------------------------------------------------

SOAK_FAULTS = ("kill-run", "terminate-sessions", "race", "broker-restart", "broker-kill", "pg-restart")
# On a three-node cluster also: one node SIGKILLed (a host that dies), started again at the next fault.
CLUSTER_SOAK_FAULTS = ("node-kill",)
RESTARTED = {"broker-restart": "kafka", "broker-kill": "kafka", "pg-restart": "postgres"}  # the service each restarts


class SoakProducer(threading.Thread):
    """Writes all along: transactions of two transactional ids, each aborting a third of its own and
    committing the rest, now and then one held open for seconds (across a batch's plan). When the broker
    restarts under it, new producers take the same ids (fencing the old ones, whose open transaction the
    broker then aborts)."""

    def __init__(self, topic: str, partitions: int, codec: Codec, seed: int, stop: threading.Event):
        super().__init__(daemon=True, name=f"produce {topic}")
        self.topic, self.partitions, self.codec, self.stop = topic, partitions, codec, stop
        self.rng = random.Random(seed)
        self.records = self.errors = 0

    def run(self) -> None:
        producers = None
        while not self.stop.is_set():
            try:
                producers = producers or transactional_producers(self.topic)
                producer = self.rng.choice(producers)
                size = self.rng.randint(20, 200)
                write_transaction(producer, self.topic, self.partitions, size, self.rng, self.codec)
                if self.rng.random() < 0.1:
                    self.stop.wait(self.rng.uniform(1, 5))
                producer.abort_transaction(30) if self.rng.random() < 1 / 3 else producer.commit_transaction(30)
                self.records += size
                self.stop.wait(self.rng.uniform(0.05, 0.3))
            except KafkaException:
                self.errors += 1
                producers = None
                self.stop.wait(1)


class SoakRunner(threading.Thread):
    """Runs the pipeline's batches one after the other until told to stop."""

    def __init__(self, pipeline: str, env: dict, stop: threading.Event):
        super().__init__(daemon=True, name=f"run {pipeline}")
        self.pipeline, self.env, self.stop = pipeline, env, stop
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self.hung: list[str] = []  # runs that outlasted RUN_BOUND_S: violations

    def running(self) -> subprocess.Popen | None:
        """The run in progress, if any."""
        proc = self.proc
        return proc if proc is not None and proc.poll() is None else None

    def run(self) -> None:
        while not self.stop.is_set():
            self.proc = start_run(self.pipeline, f"soak-{self.runs}", self.env)
            try:
                finish(self.proc)
            except RunHung as exc:
                self.hung.append(str(exc))
            self.runs += 1


def soak(seconds: float, every: float, partitions: int, rng: random.Random, env: dict,
         pipelines_dir: Path) -> dict[str, Outcome]:
    """Producers write all the time, a pipeline per format (JSON, Avro; every sink each) runs batch after
    batch, and every `every` seconds a fault strikes (the faults in turn, each target at random); then
    the producers stop, the pipelines catch up without faults and the checker runs."""
    stop = threading.Event()
    pipelines = {}
    for encoding in ("json", "avro"):
        name = f"chaos_soak_{encoding}_{uuid.uuid4().hex[:6]}"
        topic, tables, path = create_pipeline(name, encoding, partitions, pipelines_dir)
        codec = Codec(topic, encoding == "avro")
        pipelines[f"soak:{encoding}"] = (name, topic, tables, path, codec, Memory(),
                                         SoakProducer(topic, partitions, codec, rng.randrange(2**32), stop),
                                         SoakRunner(name, env, stop))
    results = {key: Outcome(iterations=1) for key in pipelines}
    for *_, producer, runner in pipelines.values():
        producer.start()
        runner.start()
    racing: list[subprocess.Popen] = []
    started = time.monotonic()
    faults = list(SOAK_FAULTS) + (list(CLUSTER_SOAK_FAULTS) if len(kafka_nodes()) >= 3 else [])
    node_down = False
    for n in itertools.count():
        time.sleep(max(0.0, started + (n + 1) * every - time.monotonic()))
        if time.monotonic() - started >= seconds:
            break
        fault, key = faults[n % len(faults)], rng.choice(sorted(pipelines))
        if n % len(faults) == len(faults) - 1:
            rng.shuffle(faults)
        name, *_, memory, _, runner = pipelines[key]
        for other, (other_name, *_, other_memory, _, _) in pipelines.items():
            results[other].violations += watch_positions(other_name, other_memory)[1]
        if node_down:
            revive_nodes()
            node_down = False
        landed = {key}
        if fault == "kill-run":  # at a random moment of a running batch (the runner starts the next at once)
            time.sleep(rng.uniform(0, 3))
            proc = until(runner.running)
            if proc is None:
                landed = set()
            else:
                kill_group(proc)
        elif fault == "terminate-sessions":  # once the pipelines have a session to lose
            landed = set(pipelines) if until(terminate_sessions) else set()
        elif fault == "node-kill":
            kill_node(rng.choice(kafka_nodes()))
            node_down, landed = True, set(pipelines)
        elif fault == "race":
            racing.append(start_run(name, f"soak-race-{n}", env))
        else:
            restart(RESTARTED[fault], kill=fault == "broker-kill")
            landed = set(pipelines)
        for hit in landed:
            results[hit].faults[fault] += 1
        target = "missed" if not landed else key if landed == {key} else "all"
        print(f"soak {time.monotonic() - started:.0f}s: {fault} on {target} (load {os.getloadavg()[0]:.1f})", flush=True)
    stop.set()
    if node_down:
        revive_nodes()
    for *_, producer, runner in pipelines.values():
        producer.join(120)
        runner.join(600)
    for proc in racing:
        finish(proc)
    for key, (name, topic, tables, path, codec, memory, producer, runner) in pipelines.items():
        outcome = results[key]
        outcome.records = producer.records
        took = recover(name, topic, env)
        outcome.worst_recovery_s = took
        if took == float("inf"):
            outcome.violations.append(f"lag not zero within {RECOVERY_BOUND_S}s")
        outcome.violations += runner.hung + check(name, topic, tables, memory, codec)
        print(f"{key}: {runner.runs} runs, {producer.records} records produced ({producer.errors} producer errors"
              f" recovered), faults {dict(outcome.faults)}, violations {len(outcome.violations)}", flush=True)
        path.unlink(missing_ok=True)
    return results
