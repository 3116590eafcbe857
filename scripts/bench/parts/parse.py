"""The `parse` part: the DAG file over many pipeline files (target 55)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.env import Env
from bench.harness import CHILD_TIMEOUT_S, row, settle
from kafka_batch.config import PROJECT_ROOT

PARSE_PROBE = ("import runpy, sys, time; import airflow.sdk, airflow.providers.standard.operators.python;"
               " started = time.perf_counter(); runpy.run_path(sys.argv[1]); print(time.perf_counter() - started)")


def write_definitions(directory: Path, count: int) -> None:
    """COUNT pipeline files: the reference pipeline, each with its own name, topic and table."""
    base = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    for n in range(count):
        raw = {**base, "name": f"p{n:03}", "topics": [f"t{n:03}"],
               "sinks": {"aggregate": {**base["sinks"]["aggregate"], "table": f"t{n:03}"}}}
        (directory / f"p{n:03}.yaml").write_text(yaml.safe_dump(raw))


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
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
        subprocess.run([airflow, "db", "migrate"], env=variables, check=True, capture_output=True,
                       timeout=CHILD_TIMEOUT_S)
        for count in sorted({10, 50, 100, args.pipelines}):
            folder = Path(home) / f"pipelines_{count}"
            folder.mkdir()
            write_definitions(folder, count)
            variables["KAFKA_BATCH_PIPELINES_DIR"] = str(folder)
            for _ in range(args.repeat):
                settle()
                probe = subprocess.run([sys.executable, "-c", PARSE_PROBE, dag_file], env=variables, check=True,
                                       capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
                own[count] = row(f"DAG file, {count} pipelines", float(probe.stdout.split()[-1]), "s",
                                 f"{2 * count} DAGs, Airflow's import not counted")["value"]
                report = subprocess.run([airflow, "dags", "report", "-o", "json"], env=variables, check=True,
                                        capture_output=True, text=True, timeout=CHILD_TIMEOUT_S).stdout
                parsed = json.loads(report[report.index("[{"):])[0]
                hours, minutes, seconds = parsed["duration"].split(":")
                row(f"dags report, {count} pipelines", float(seconds) + 60 * int(minutes) + 3600 * int(hours), "s",
                    f"Airflow's DagBag parse of the file: {parsed['dag_num']} DAGs, {parsed['task_num']} tasks")
    return [(f"55 DAG file over {args.pipelines} pipeline files <= 1 s", own[args.pipelines], 1, "<=")]
