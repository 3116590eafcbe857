"""`make chaos`'s command line: the scenarios in turn (each on a pipeline of its own with every sink),
then the soak; a table of what landed and every violation, and the JSON record."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psycopg2
from confluent_kafka.admin import AdminClient
from tabulate import tabulate

from kafka_batch_dev import chaos
from kafka_batch_dev.chaos import harness
from kafka_batch_dev.chaos.harness import (
    RECOVERY_BOUND_S,
    Outcome,
    RunHung,
    chaos_environment,
    kafka_bootstrap,
    pg_params,
    recover,
    run_environment,
)
from kafka_batch_dev.chaos.pipeline import create_pipeline
from kafka_batch_dev.chaos.scenarios import CLUSTER_SCENARIOS, DRIVER_STRIKES, SCENARIOS, scenario
from kafka_batch_dev.chaos.soak import soak
from kafka_batch_dev.chaos.truth import Codec, Memory, check, commit_late, produce


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=chaos.__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2, help="per scenario")
    parser.add_argument("--records", type=int, default=20_000, help="produced per iteration")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--scenarios", help="comma-separated; default: every scenario (and on a three-node cluster"
                        " the node kills)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    parser.add_argument("--soak", type=float, default=0, metavar="SECONDS",
                        help="after the scenarios: producers, batches and faults all at once for this long")
    parser.add_argument("--fault-every", type=float, default=15, metavar="SECONDS", help="in the soak")
    parser.add_argument("--recover-on", choices=["spark-submit", "spark-connect"], default="spark-submit",
                        help="how the fault-free runs after a strike reach Spark (spark-connect: the server of "
                        "`kafka-batch local up`)")
    parser.add_argument("--strike-on", choices=["spark-submit", "spark-connect"], default="spark-submit",
                        help="how the struck run reaches Spark where the strike hits the driver's commit alone "
                        "(kill-commit, kill-published, kill-after-commit, terminate-commit); the other strikes "
                        "always go through spark-submit")
    parser.add_argument("--services-home", type=Path, help="the local home whose Kafka node and Postgres the restarts"
                        " stop and start (default: `kafka-batch local`'s)")
    args = parser.parse_args(argv)
    harness.SERVICES_HOME = args.services_home
    rng = random.Random(args.seed)
    env = chaos_environment()
    from kafka_batch.core import database  # setup only: the schema exists before the first fault

    conn = psycopg2.connect(**pg_params())
    database.apply_migrations(conn)
    conn.close()
    # The suite's pipelines live in a directory of their own, never among the project's pipelines.
    pipelines_dir = Path(tempfile.mkdtemp(prefix="kafka_batch_chaos_pipelines_"))
    env["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines_dir)
    recovery_env = run_environment(env, args.recover_on, "--recover-on")
    driver_strike_env = run_environment(env, args.strike_on, "--strike-on")
    results = {}
    names = args.scenarios if args.scenarios is not None else ",".join(
        SCENARIOS + (CLUSTER_SCENARIOS if len(harness.kafka_nodes()) >= 3 else []))
    for name in filter(None, names.split(",")):
        outcome = results[name] = Outcome()
        strike, _, encoding = name.partition(":")
        pipeline = f"chaos_{strike.replace('-', '_')}{'_' + encoding if encoding else ''}_{uuid.uuid4().hex[:6]}"
        topic, tables, path = create_pipeline(pipeline, encoding, args.partitions, pipelines_dir,
                                              strike.removeprefix("retention-") if strike.startswith("retention-")
                                              else None)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
        memory = Memory()
        codec = Codec(topic, encoding == "avro")
        try:
            for iteration in range(args.iterations):
                started = time.monotonic()
                late = produce(topic, args.partitions, args.records, rng, open_txn=iteration % 2 == 0, codec=codec)
                produced = time.monotonic()
                outcome.records += args.records
                strike_env = driver_strike_env if strike in DRIVER_STRIKES else env
                try:
                    outcome.faults += scenario(strike, pipeline, topic, f"it{iteration}", strike_env, rng, tables,
                                               memory, path)
                except RunHung as exc:  # killed; the recovery and the check below still run
                    outcome.violations.append(f"iteration {iteration}: {exc}")
                struck = time.monotonic()
                if late is not None:
                    commit_late(late)
                took = recover(pipeline, topic, recovery_env)
                outcome.worst_recovery_s = max(outcome.worst_recovery_s, took)
                if took == float("inf"):
                    outcome.violations.append(f"iteration {iteration}: lag not zero within {RECOVERY_BOUND_S}s")
                checking = time.monotonic()
                outcome.violations += [f"iteration {iteration}: {v}"
                                       for v in check(pipeline, topic, tables, memory, codec)]
                outcome.iterations += 1
                print(f"{name} iteration {iteration}: faults {dict(outcome.faults)}, "
                      f"violations {len(outcome.violations)}, recovery {took:.0f}s (produce {produced - started:.0f}s,"
                      f" strike {struck - produced:.0f}s, check {time.monotonic() - checking:.0f}s,"
                      f" load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            path.unlink(missing_ok=True)
            if not outcome.violations:  # topics with a violation stay, to be looked into
                for done in (topic, tables["kafka"]):
                    admin.delete_topics([done], operation_timeout=60)[done].result()
    if args.soak:
        results.update(soak(args.soak, args.fault_every, args.partitions, rng, recovery_env, pipelines_dir))
    shutil.rmtree(pipelines_dir, ignore_errors=True)
    rows = [(name, o.iterations, ", ".join(f"{k}: {v}" for k, v in sorted(o.faults.items())) or "0",
             o.records, len(o.violations), f"{o.worst_recovery_s:.0f}") for name, o in results.items()]
    print(tabulate(rows, headers=["scenario", "iterations", "faults landed", "records", "violations",
                                  "worst recovery s"]))
    for name, o in results.items():
        for violation in o.violations:
            print(f"VIOLATION {name}: {violation}")
    if args.json:
        args.json.write_text(json.dumps({name: {"iterations": o.iterations, "faults": dict(o.faults),
                                                "records": o.records, "violations": o.violations,
                                                "worst_recovery_s": o.worst_recovery_s}
                                         for name, o in results.items()}, indent=2))
    return 1 if any(o.violations for o in results.values()) else 0
