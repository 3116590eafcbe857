"""A short run of the fault-injection suite (`make chaos` runs the full one): faults land in the phase
they are meant for, and the independent checker finds no exactly-once violation."""

from __future__ import annotations

import json
import os

import pytest

from kafka_batch_dev.chaos.cli import main as chaos

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_kills_in_commit_and_reading_and_zombies_leave_no_violation(services, tmp_path):
    # Every pipeline here also publishes to Kafka (rows for JSON, the aggregate's changelog for Avro);
    # kill-producing strikes inside the Kafka sink's transaction, kill-published after it committed and
    # before Postgres's commit did.
    report = tmp_path / "chaos.json"
    # The strikes go through spark-submit; the recovery after them on the tests' Spark Connect server.
    recover_on = "spark-connect" if "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT" in os.environ else "spark-submit"
    code = chaos(["--iterations", "1", "--records", "3000", "--scenarios",
                          "kill-commit,kill-producing,kill-published,zombie,kill-reading:avro",
                          "--recover-on", recover_on, "--json", str(report)])
    results = json.loads(report.read_text())
    assert {name: r["violations"] for name, r in results.items()} == {
        "kill-commit": [], "kill-producing": [], "kill-published": [], "zombie": [], "kill-reading:avro": []}
    assert results["kill-commit"]["faults"] == {"commit": 1}  # the kill landed inside the commit transaction
    assert results["kill-producing"]["faults"] == {"producing": 1}  # inside the Kafka transaction
    assert results["kill-published"]["faults"] == {"published": 1}
    assert results["zombie"]["faults"] == {"zombie": 1}
    assert results["kill-reading:avro"]["faults"] == {"reading": 1}  # on a topic of Avro values
    assert code == 0

