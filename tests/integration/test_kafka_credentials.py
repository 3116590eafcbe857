"""Kafka credentials from the connection reach every client of a batch: the planner, the Spark driver
and the executors' readers (issue #10, section 5).

The local broker has no authentication, so a SASL/PLAIN gate stands in front of it (sasl_gate.py): a
connection that skips authentication or brings a wrong password is closed, as a SASL listener does.
The password is the planted one, so the session's final scan of every log also covers it.
"""

from __future__ import annotations

import json
import os

import pytest

from kafka_batch_dev import sample_data
from tests.conftest import FAKE_PASSWORD
from tests.integration.helpers import (
    ground_truth,
    kafka_config,
    new_pipeline,
    positions,
    query,
    rows_contents,
    rows_truth,
    run_cli,
    table_contents,
)
from tests.integration.sasl_gate import API_VERSIONS, FETCH, LIST_OFFSETS, SASL_AUTHENTICATE, SASL_HANDSHAKE, SaslGate

pytestmark = pytest.mark.integration

USER = "kafka_batch"


def _sasl_connection(port: int, password: str) -> str:
    """A Kafka connection as an operator stores it for a SASL listener (the Kafka provider's form)."""
    return json.dumps({"conn_type": "kafka", "login": USER, "password": password, "extra": {
        "bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}})


@pytest.fixture
def gate(services):
    if os.environ.get("KAFKA_BATCH_TEST_BOOTSTRAP"):
        pytest.skip("the SASL gate fronts the embedded broker; a given Kafka brings its own listener settings")
    host, port = kafka_config()["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    with SaslGate(int(port), USER, FAKE_PASSWORD, host) as gate:
        yield gate


def test_the_connections_sasl_settings_reach_planner_driver_and_executors(gate):
    pipeline = new_pipeline("sasl", partitions=2, rows=True, spark_submit=True, connections={"kafka": "kafka_sasl"})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 400, seed=21)

    run_cli("run", "--pipeline", pipeline.name, env={"AIRFLOW_CONN_KAFKA_SASL": _sasl_connection(gate.port, FAKE_PASSWORD)})

    assert table_contents(pipeline) == ground_truth(topic)
    assert rows_contents(pipeline) == rows_truth(topic)
    assert sum(positions(pipeline.name).values()) == 400
    # Every connection that reached the broker authenticated with the connection's credentials; the
    # planner asked for offsets and the executors fetched through authenticated connections only.
    assert gate.clients and not [c for c in gate.clients if c.refused]
    assert {c.user for c in gate.clients if set(c.requests) - {API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE}} == {USER}
    assert any(LIST_OFFSETS in c.requests for c in gate.clients)
    assert any(FETCH in c.requests for c in gate.clients)


def test_a_wrong_kafka_password_is_refused_before_anything_changes(gate):
    pipeline = new_pipeline("sasl_wrong", partitions=1, read={"kafka_timeout_seconds": 5})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 50, seed=22)

    refused = run_cli("run", "--pipeline", pipeline.name, check=False,
                      env={"AIRFLOW_CONN_KAFKA_DEFAULT": _sasl_connection(gate.port, "not-the-password")})

    # An input error (exit 2, never retried by Airflow) that says what was refused, in one line.
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("kafka-batch: invalid input: Kafka refused the credentials of the connection: "), line
    assert "SASL authentication error: Authentication failed: invalid user or password" in line
    assert "not-the-password" not in refused.stdout + refused.stderr
    assert [c for c in gate.clients if c.refused] and not [c for c in gate.clients if c.user]
    assert query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name) == [(0,)]
