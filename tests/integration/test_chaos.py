"""A short run of the fault-injection suite (`make chaos` runs the full one, every scenario, the rest of
them among them: kill-producing, kill-reading on Avro, the races): faults land in the phase they are meant
for, and the independent checker finds no exactly-once violation."""

from __future__ import annotations

import json
import os

import pytest

from kafka_batch_dev.chaos.cli import main as chaos

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_kills_in_the_commit_and_between_the_commits_and_a_zombie_leave_no_violation(services, tmp_path):
    # Every pipeline here also publishes to Kafka (rows for JSON): kill-commit strikes inside Postgres's commit
    # transaction, kill-published after the Kafka sink's transaction committed and before Postgres's did, and
    # a zombie attempt is fenced.
    report = tmp_path / "chaos.json"
    # On the tests' Spark Connect server: the strikes on the commit (the CLI is the driver there, as in
    # Airflow's tasks of such pipelines) and the recovery after every strike. The zombie goes through
    # spark-submit, whose JVM outlives the killed CLI; `make chaos` strikes the commit through it too.
    spark = "spark-connect" if "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT" in os.environ else "spark-submit"
    code = chaos(["--iterations", "1", "--records", "3000", "--scenarios", "kill-commit,kill-published,zombie",
                  "--strike-on", spark, "--recover-on", spark, "--json", str(report)])
    results = json.loads(report.read_text())
    assert {name: r["violations"] for name, r in results.items()} == {
        "kill-commit": [], "kill-published": [], "zombie": []}
    assert results["kill-commit"]["faults"] == {"commit": 1}  # the kill landed inside the commit transaction
    assert results["kill-published"]["faults"] == {"published": 1}
    assert results["zombie"]["faults"] == {"zombie": 1}
    assert code == 0
