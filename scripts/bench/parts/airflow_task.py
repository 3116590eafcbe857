"""The `airflow` part: a small batch as an Airflow DAG run, in each execution mode (target 11's other half; 68)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

from bench.env import CONNECT, MODE, SUBMIT, Env
from bench.harness import ROWS, row, settle
from bench.peers.plain import plain_process
from kafka_batch_dev import local_stack, sample_data
from kafka_batch_dev.airflow_api import Server


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


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """The fixed cost of a small batch in an Airflow task (target 11's other half, and issue 68's target for
    spark-submit where production runs it): Airflow's scheduler and LocalExecutor run the pipelines' DAGs
    as they run the samples', and the execute task's duration as Airflow records it is measured (the task
    parses the DAG file, resolves the connections, runs the batch and commits), with the whole DAG run's
    (four tasks and the scheduler's turns). Two pipelines read the same topic, one per execution mode, and
    take turns. Airflow is started here on the bench's pipelines, and stopped at the end."""
    base = local_stack.home()
    state = local_stack.read_state(base)
    if local_stack.airflow_running(state):
        print("  airflow: skipped, Airflow is running on the samples' pipelines (`make down`, then `make bench`)")
        return []
    topic = f"{env.prefix}_airflow"
    sample_data.ensure_topic(env.kafka, topic, 1)
    pipelines = {CONNECT: env.pipeline("airflow", topic, CONNECT), SUBMIT: env.pipeline("airflow_submit", topic, SUBMIT)}
    produced = args.fixed_records
    sample_data.produce_page_views(env.kafka, topic, produced, seed=6)
    url = local_stack.start_airflow(base, state, {"KAFKA_BATCH_PIPELINES_DIR": str(env.pipelines)})
    try:
        server = Server(url, *local_stack.airflow_login(base), base / "airflow-api-server.log")
        token = server.token()
        for pipeline in pipelines.values():
            _unpause(server, token, pipeline.dag_id)
            # A new package's first batch on Spark Connect starts the session's Python workers; the first
            # spark-submit of this bench's run was the `fixed` part's or this one.
            _dag_run(server, token, pipeline.dag_id)
        for n in range(args.repeat):
            sample_data.produce_page_views(env.kafka, topic, args.fixed_records, seed=60 + n)
            produced += args.fixed_records
            for spark, pipeline in pipelines.items():
                settle(idle_pct=30)  # Airflow's own loops keep an idle machine a little busy
                took = _dag_run(server, token, pipeline.dag_id)
                row(f"fixed cost in an Airflow task, {MODE[spark]}", took["execute"], "s", f"the execute task of a DAG"
                    f" run of {args.fixed_records:,} records (Airflow's duration); the run's tasks {took}", tasks=took)
                row(f"DAG run of a small batch, {MODE[spark]}", took["run"], "s", f"{args.fixed_records:,} records:"
                    " plan, execute, report and the scheduler's turns between them", tasks=took)
    finally:
        local_stack.stop_airflow(state)
    best = {spark: next(r for r in ROWS if r["name"] == f"fixed cost in an Airflow task, {MODE[spark]}")["value"]
            for spark in pipelines}
    plain = plain_process(env, [(topic, 0, produced - args.fixed_records, produced)],
                          name="plain consumer process, Airflow task's records")
    return [("11 same, Airflow's execute task / plain process <= 7", best[CONNECT] / plain["value"], 7, "<="),
            ("68 fixed cost (s) <= 5, spark-submit, Airflow's execute task", best[SUBMIT], 5, "<=")]


def _unpause(server: Server, token: str, dag_id: str) -> None:
    """Unpause the DAG once the DAG processor's first parse of its file has found it (404 until then)."""
    deadline = time.monotonic() + 180
    while (status := server.call("PATCH", f"api/v2/dags/{dag_id}", {"is_paused": False},
                                 token=token)[0]) == 404 and time.monotonic() < deadline:
        time.sleep(2)
    if status >= 300:
        raise RuntimeError(f"Airflow answered {status} to unpausing {dag_id}; see {server.log}")
