"""The one spark-submit call: what it ships to executors, what its command line holds, and that the
temporary --py-files folder is gone after the job."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from kafka_batch.config import PROJECT_ROOT, load_pipeline, parse_pipeline
from kafka_batch.connections import ConnectionFields
from kafka_batch.spark import jvm_archive, submit
from kafka_batch.spark.execution import batch_execution

SECRET = "pw-that-must-not-show"
LOCAL = ConnectionFields("spark_default", "spark", "local[*]")


def _page_views_by_spark_submit():
    """The sample pipeline on the spark-submit execution (`spark_default`), which these tests are about."""
    sample = load_pipeline("page_views", PROJECT_ROOT / "pipelines")
    return parse_pipeline({**sample.definition, "connections": {**sample.definition["connections"],
                                                                "spark": "spark_default"}})


def test_the_package_zip_ships_no_airflow_code_the_command_no_secret_and_is_removed(monkeypatch):
    pipeline = _page_views_by_spark_submit()
    conns = (ConnectionFields(pipeline.connections.postgres, "postgres", "db.example", 5432, "kb", SECRET, "kb"),
             ConnectionFields(pipeline.connections.kafka, "kafka", extra={"sasl.password": SECRET}))
    with submit.spark_submit_hook(pipeline, 7, LOCAL, conns) as hook:
        zipped = Path(hook._py_files)
        names = zipfile.ZipFile(zipped).namelist()
        command = hook._build_spark_submit_command(str(submit.APPLICATION))
        env = hook._env_vars
    assert "kafka_batch/spark/job.py" in names and "kafka_batch/core/commit.py" in names
    assert not [n for n in names if n.startswith("kafka_batch/airflow/") or n.startswith("kafka_batch/cli/")]
    assert SECRET not in " ".join(command)  # connections travel in the child's environment only
    assert SECRET in env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"] and SECRET in env["AIRFLOW_CONN_KAFKA_DEFAULT"]
    assert not zipped.exists() and not zipped.parent.exists()


def test_only_a_driver_on_this_machine_is_given_the_jvm_class_archive(monkeypatch, tmp_path):
    monkeypatch.setenv(jvm_archive.ENV, str(tmp_path))
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    pipeline = _page_views_by_spark_submit()
    postgres = ConnectionFields(pipeline.connections.postgres, "postgres", "db.example", 5432, "kb", "pw", "kb")
    kafka = ConnectionFields(pipeline.connections.kafka, "kafka", extra={"bootstrap.servers": "k:9092"})
    given = {}
    for deploy_mode in ("client", "cluster"):
        spark = ConnectionFields("spark_default", "spark", "spark://m:7077", extra={"deploy-mode": deploy_mode})
        with batch_execution(pipeline, 7, postgres, kafka, spark) as execution:
            given[deploy_mode] = execution.hook._env_vars.get("SPARK_SUBMIT_OPTS", "")
    assert "-XX:ArchiveClassesAtExit=" in given["client"]  # no archive yet: this run would write it
    assert given["cluster"] == ""  # the driver runs elsewhere, where the archive is not


def test_a_short_batch_starts_its_jvm_with_c1_only_and_your_own_options_win(monkeypatch, tmp_path):
    monkeypatch.setenv(jvm_archive.ENV, jvm_archive.OFF)
    pipeline = _page_views_by_spark_submit()
    conns = (ConnectionFields(pipeline.connections.postgres, "postgres", "db.example", 5432, "kb", "pw", "kb"),)

    def options(span, **kwargs):
        with submit.spark_submit_hook(pipeline, 7, LOCAL, conns, span=span, **kwargs) as hook:
            return hook._env_vars.get("SPARK_SUBMIT_OPTS", "")

    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    assert options(submit.SHORT_BATCH_OFFSETS) == submit.SHORT_BATCH_JVM
    assert options(submit.SHORT_BATCH_OFFSETS + 1) == ""  # a long read gets C2's faster code
    assert options(None) == ""  # unknown
    assert options(10, driver_is_local=False) == ""  # the driver runs elsewhere
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=4")
    assert options(10).split() == [submit.SHORT_BATCH_JVM, "-XX:TieredStopAtLevel=4"]  # the JVM takes the last


def test_yarn_gets_spark_home_with_pyspark_zips_every_other_master_the_view(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    pipeline = _page_views_by_spark_submit()
    postgres = ConnectionFields(pipeline.connections.postgres, "postgres", "db.example", 5432, "kb", "pw", "kb")
    kafka = ConnectionFields(pipeline.connections.kafka, "kafka", extra={"bootstrap.servers": "k:9092"})
    homes = {}
    for name, spark in [("local", ConnectionFields("spark_default", "spark", "local[*]")),
                        ("standalone", ConnectionFields("spark_default", "spark", "spark://m:7077")),
                        ("yarn", ConnectionFields("spark_default", "spark", "yarn")),
                        ("missing", None)]:  # the provider's hook then submits to YARN
        with batch_execution(pipeline, 7, postgres, kafka, spark) as execution:
            homes[name] = Path(execution.hook._env_vars["SPARK_HOME"])
    assert homes["local"] == homes["standalone"] and homes["local"].parent == tmp_path / "kafka_batch"
    for name in ("yarn", "missing"):  # "pyspark.zip not found; cannot run pyspark application in YARN mode"
        assert (homes[name] / "python" / "lib" / "pyspark.zip").is_file(), name


def test_the_hook_submits_to_the_connection_it_is_given_and_without_one_to_its_default_master(monkeypatch):
    # Airflow's own lookup would find this one: the connection resolved by the caller (the operator, the CLI) wins.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://other:7077"}))
    pipeline = _page_views_by_spark_submit()
    given = ConnectionFields("spark_default", "spark", "spark://m:7077", extra={"deploy-mode": "client"})
    commands = {}
    for name, spark in [("given", given), ("undefined", None)]:
        with submit.spark_submit_hook(pipeline, 7, spark, ()) as hook:
            commands[name] = hook._build_spark_submit_command(str(submit.APPLICATION))

    def option(command: list[str], name: str) -> str | None:
        return command[command.index(name) + 1] if name in command else None

    assert (option(commands["given"], "--master"), option(commands["given"], "--deploy-mode")) == ("spark://m:7077",
                                                                                                   "client")
    assert option(commands["undefined"], "--master") == "yarn"  # the provider's default, as before


_UNINITIALISED = """
import os
from kafka_batch.spark import submit
submit._hook_class()
import airflow.settings
print(airflow.settings.engine is None, submit.AIRFLOW_AS_LIBRARY in os.environ)
"""


def test_a_process_without_airflow_imports_it_uninitialised_and_leaves_its_children_to_initialise_it():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != submit.AIRFLOW_AS_LIBRARY}
    printed = subprocess.run([sys.executable, "-c", _UNINITIALISED], env=env, cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
    assert printed == ["True", "False"]  # no metadata database engine; a spark-submit child inherits no flag


_HOLDER = """
import os, signal, sys
from kafka_batch.spark import submit
from tests.unit.test_submit import LOCAL, _page_views_by_spark_submit
with submit.spark_submit_hook(_page_views_by_spark_submit(), 7, LOCAL, ()) as hook:
    print(hook._py_files, flush=True)
    if sys.argv[1] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)  # as Airflow or the OOM killer ends a task: no cleanup runs
    sys.stdin.read()  # held until the test closes its input
"""


def test_a_killed_commands_package_is_removed_by_the_next_command_and_a_running_ones_kept(monkeypatch, tmp_path):
    import os
    import subprocess
    import sys
    import tempfile
    import threading

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    holders = {how: subprocess.Popen([sys.executable, "-c", _HOLDER, how], env=env, text=True, cwd=PROJECT_ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE) for how in ("killed", "running")}
    # A holder that never prints its package is killed (its line is then empty) rather than waited for.
    watchdog = threading.Timer(120, lambda: [holder.kill() for holder in holders.values()])
    watchdog.start()
    try:
        zips = {how: Path(holder.stdout.readline().strip()) for how, holder in holders.items()}
    finally:
        watchdog.cancel()
    holders["killed"].wait(timeout=60)
    assert zips["killed"].exists() and zips["running"].exists()  # both left where they were made
    try:
        with submit.spark_submit_hook(_page_views_by_spark_submit(), 8, LOCAL, ()):
            assert not zips["killed"].parent.exists()
            assert zips["running"].exists()  # its command still runs
    finally:
        holders["running"].communicate("", timeout=60)
    assert not zips["running"].parent.exists()  # removed by its own command
