"""The Kafka node SIGKILLed under a batch, through the fault-injection suite: while the batch's tasks read,
and between the Kafka and the Postgres commit. The independent checker finds no exactly-once violation.
`make chaos` also kills it inside the Kafka sink's transaction (`broker-kill-publishing`)."""

from __future__ import annotations

import json
import os

import pytest

from kafka_batch_dev import local_stack
from kafka_batch_dev.chaos.cli import main as chaos

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.long_fault]


@pytest.fixture
def own_node(services, tmp_path):
    """A Kafka node of this test's own (the session's broker serves other tests meanwhile), recorded in
    `tmp_path`/state.json as `kafka-batch local` records its services, so the faults restart it there."""
    state: dict = {}
    local_stack.start_kafka(tmp_path, state)
    (tmp_path / "state.json").write_text(json.dumps(state))
    try:
        yield tmp_path, f"127.0.0.1:{state['kafka_port']}"
    finally:
        local_stack.stop_kafka(local_stack.read_state(tmp_path))


def test_the_kafka_node_sigkilled_while_reading_and_between_the_commits(own_node, tmp_path, monkeypatch):
    # The node dies while the batch's tasks read from it, and after the Kafka sink's transaction committed
    # but before Postgres's did; each time it restarts on its data, the run goes on or fails, and the
    # fault-free runs after it recover.
    home, bootstrap = own_node
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka",
                                                                 "extra": {"bootstrap.servers": bootstrap}}))
    report = tmp_path / "chaos.json"
    recover_on = "spark-connect" if "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT" in os.environ else "spark-submit"
    scenarios = ["broker-kill-reading", "broker-kill-published"]
    code = chaos(["--iterations", "1", "--records", "3000", "--scenarios", ",".join(scenarios),
                          "--recover-on", recover_on, "--services-home", str(home), "--json", str(report)])
    results = json.loads(report.read_text())
    assert {name: r["violations"] for name, r in results.items()} == dict.fromkeys(scenarios, [])
    assert results["broker-kill-reading"]["faults"] == {"reading": 1}
    assert results["broker-kill-published"]["faults"] == {"published": 1}  # between the two commits
    assert code == 0
