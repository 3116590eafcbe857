"""The package as a team installs it where it runs Airflow: `python -m build` makes an sdist and a wheel
(built from the sdist, so the sdist holds everything); the wheel, installed with constraints.txt into a
fresh virtualenv with no checkout on its path (not editable), brings the command, the console plugin and
the provider through their entry points, the DAGs of a pipelines folder from the two-line DAG file of
dags/, and one batch of a sample pipeline that commits exactly: through spark-submit, so the driver and
the executors run the installed code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kafka_batch.config import load_pipeline
from kafka_batch_dev import sample_data
from tests.conftest import ROOT
from tests.integration.helpers import create_topic, ground_truth, kafka_config, table_contents

pytestmark = pytest.mark.integration

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# Not part of the sources a release is built from.
_NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".local", "__pycache__", "*.egg-info", "build", "dist",
                                      ".pytest_cache", ".ruff_cache", "node_modules")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed (and its pinned dependencies); its directory."""
    work = tmp_path_factory.mktemp("distribution")
    sources = work / "sources"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, sources, ignore=_NOT_SOURCES, symlinks=True)
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"), str(sources)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel, sdist = (work / "dist" / f"kafka_batch-{VERSION}-py3-none-any.whl"), (work / "dist" / f"kafka_batch-{VERSION}.tar.gz")
    assert wheel.is_file() and sdist.is_file(), sorted(os.listdir(work / "dist"))
    venv = work / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # --no-compile: the bytecode of Airflow and Spark is not what this test is about (a minute of CPU).
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", "-c", str(ROOT / "constraints.txt"),
                          str(wheel)], capture_output=True, text=True, timeout=1200)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return venv


def _environment(venv: Path, services: dict, home: Path, pipelines: Path) -> dict[str, str]:
    """The services' connections, a fresh Airflow home and pipelines folder, the virtualenv first on PATH
    (spark-submit finds Spark through it) and nothing of the checkout."""
    env = {key: value for key, value in services.items() if key.startswith(("AIRFLOW_CONN_", "KAFKA_BATCH_", "SPARK_"))}
    # Airflow's commands need a migrated metadata database: the session's (the same Airflow version).
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = services["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dags" / "kafka_batch_pipelines.py", dags)  # the DAG file a user writes
    return {**env, "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "KAFKA_BATCH_PIPELINES_DIR": str(pipelines), "KAFKA_BATCH_LOG_DIR": str(home / "logs")}


def _json(output: str):
    """The JSON an Airflow command printed after its log lines (which go to stdout too)."""
    return json.loads(next(line for line in reversed(output.splitlines()) if line.startswith(("[", "{"))))


def _run(env: dict, *command: str) -> str:
    done = subprocess.run(list(command), env=env, cwd=env["HOME"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


def test_the_wheel_installs_the_command_the_console_the_provider_and_dags_and_a_batch_commits_exactly(
        installed, services, tmp_path):
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    # One sample, as a user copies it: pipelines/page_views.yaml on a topic and table of its own, run by
    # spark-submit on local Spark.
    name = f"installed_{os.urandom(4).hex()}"
    sample = yaml.safe_load((ROOT / "pipelines" / "page_views.yaml").read_text())
    sample.update(name=name, topics=[f"{name}_topic"], schedule=None,
                  connections={**sample.get("connections", {}), "spark": "spark_default"})
    sample["sinks"]["aggregate"]["table"] = f"{name}_minutes"
    (pipelines / f"{name}.yaml").write_text(yaml.safe_dump(sample))
    env = _environment(installed, services, tmp_path / "home", pipelines)

    # The package comes from the virtualenv, not the checkout.
    where = _run(env, "python", "-c", "import kafka_batch, sys; print(kafka_batch.__file__); print(sys.path)")
    assert where.splitlines()[0].startswith(str(installed)) and str(ROOT) not in where, where
    assert _run(env, "kafka-batch", "--version").strip() == f"kafka-batch {VERSION}"
    plugins = _json(_run(env, "airflow", "plugins", "--output", "json"))
    [console] = [p for p in plugins if p["name"] == "kafka_batch_console"]
    assert console["source"].startswith(f"kafka-batch=={VERSION}: EntryPoint"), console["source"]
    assert [v["name"] for v in console["external_views"]] == ["Kafka batches"]
    providers = _json(_run(env, "airflow", "providers", "list", "--output", "json"))
    assert {"package_name": "kafka-batch", "version": VERSION} in [
        {k: p[k] for k in ("package_name", "version")} for p in providers], providers
    dags = _json(_run(env, "airflow", "dags", "list", "--local", "--output", "json"))
    assert sorted(d["dag_id"] for d in dags) == [f"kafka_batch__{name}", f"kafka_batch__{name}__replay"], dags

    # One batch, and it commits exactly what the topic holds (read independently).
    topic = f"{name}_topic"
    create_topic(topic, 3)
    sample_data.produce_page_views(kafka_config(), topic, 2_000, seed=69)
    _run(env, "kafka-batch", "run", "--pipeline", name)
    pipeline = load_pipeline(name, pipelines)
    assert table_contents(pipeline) == ground_truth(topic)
