"""Batches on a real Spark standalone cluster: a master and two workers started from the installed
Spark distribution on loopback, the job submitted in client mode to `spark://` with the package
shipped by `--py-files` (as in docker-compose), and through a Spark Connect server whose executors run
on the cluster's workers (the package travels as a session artifact); results compared with the topic
read independently."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from kafka_batch.spark.submit import spark_environment
from kafka_batch_dev import local_stack, sample_data
from kafka_batch_dev.local_stack import free_port
from tests.integration.helpers import (
    batches_of,
    ground_truth,
    kafka_config,
    new_pipeline,
    own_spark_connect,
    rows_contents,
    rows_truth,
    run_cli,
    table_contents,
)

pytestmark = pytest.mark.integration
WORKERS = 2


def _master_state(ui_port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
            return json.load(response)
    except (OSError, ValueError):  # not answering yet, or an HTML page while the master's UI starts (seen in CI)
        return {}


@contextmanager
def standalone_cluster(directory: Path):
    """`spark://127.0.0.1:<port>` with WORKERS workers of one core each; every process stopped at the end."""
    env = {**os.environ, **spark_environment(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(directory)}
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    commands = [[spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(ui)]]
    commands += [[spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(directory / f"worker{n}"),
                  master] for n in range(WORKERS)]
    processes = []
    try:
        for n, command in enumerate(commands):
            with open(directory / f"process{n}.log", "ab") as log:
                processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        deadline = time.monotonic() + 180
        while sum(w.get("state") == "ALIVE" for w in _master_state(ui).get("workers", [])) < WORKERS:
            assert time.monotonic() < deadline, f"the standalone cluster did not come up; logs in {directory}"
            assert all(p.poll() is None for p in processes), f"a cluster process exited; logs in {directory}"
            time.sleep(1)
        yield master, ui
    finally:
        pids = {p.pid for p in processes}  # each leads its process group (executors included)
        left = local_stack.stop_processes(pids, pids, [(signal.SIGTERM, 30.0), (signal.SIGKILL, local_stack.KILL_WAIT)])
        assert not left, f"cluster processes survived SIGKILL: {left}"


@pytest.fixture(scope="module")
def cluster(services, tmp_path_factory):
    """One standalone cluster for the module's tests: (master URL, UI port, the workers' directory)."""
    directory = tmp_path_factory.mktemp("standalone")
    with standalone_cluster(directory) as (master, ui):
        yield master, ui, directory


def _executor_logs(directory: Path, worker: int, app_id: str) -> list[Path]:
    """The stderr of each executor the application ran on the worker."""
    return list((directory / f"worker{worker}" / app_id).rglob("stderr"))


def _batches_equal_the_topic(pipeline, records: int, seeds: tuple[int, ...]) -> None:
    """A batch of `records` new page views per seed, the tables equal to the topic after each."""
    topic = pipeline.topics[0]
    for seed in seeds:
        sample_data.produce_page_views(kafka_config(), topic, records, seed=seed)
        run_cli("run", "--pipeline", pipeline.name)
        assert table_contents(pipeline) == ground_truth(topic)
        assert rows_contents(pipeline) == rows_truth(topic)


def test_batches_on_a_standalone_cluster_equal_the_ground_truth(cluster, monkeypatch):
    master, ui, directory = cluster
    host, port = master.rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE",
                       json.dumps({"conn_type": "spark", "host": host, "port": int(port),
                                   "extra": {"deploy-mode": "client"}}))
    pipeline = new_pipeline("standalone", partitions=3, rows=True, spark_submit=True,
                            connections={"spark": "spark_standalone"},
                            limits={"max_records_per_task": 700, "min_tasks": 2})
    # One batch: each starts an application whose executors start on the workers (about 30 s); the
    # batch after another is the Spark Connect test's.
    _batches_equal_the_topic(pipeline, records=1500, seeds=(1,))

    # The batches ran on the cluster: the master lists them, and executors ran on the workers.
    state = _master_state(ui)
    ours = {f"kafka_batch:batch-{batch[0]}" for batch in batches_of(pipeline.name)}
    apps = [a for a in state.get("completedapps", []) + state.get("activeapps", []) if a["name"] in ours]
    assert len(ours) == 1 and {a["name"] for a in apps} == ours, state
    assert [path for a in apps for n in range(WORKERS) for path in _executor_logs(directory, n, a["id"])], \
        "no executor ran on the workers"


def test_batches_through_spark_connect_on_a_standalone_cluster_read_on_both_workers(cluster, tmp_path, monkeypatch):
    """A Spark Connect server with `--master spark://...`: its executors on both workers read the batch's
    tasks, and the tables equal the ground truth."""
    master, ui, directory = cluster
    with own_spark_connect(tmp_path, "spark_connect_cluster", master):
        pipeline = new_pipeline("standalone_connect", partitions=4, rows=True,
                                connections={"spark": "spark_connect_cluster"},
                                limits={"max_records_per_task": 500, "min_tasks": 4})
        _batches_equal_the_topic(pipeline, records=2000, seeds=(3, 4))
        # The server is the cluster's application, and its executor on each worker ran read tasks.
        apps = _master_state(ui).get("activeapps", [])
        assert [a["name"] for a in apps] == ["kafka_batch Spark Connect"], apps
        for n in range(WORKERS):
            logs = "".join(path.read_text() for path in _executor_logs(directory, n, apps[0]["id"]))
            assert "Running task" in logs, f"no task of the server's ran on worker {n}"
