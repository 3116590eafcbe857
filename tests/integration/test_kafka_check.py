"""The transactional check of a Kafka cluster (`kafka-batch check-kafka`) and the refusal of batches to read
from a cluster that failed it: on the session's broker (it passes), and on noida-db without its front,
which lists aborted transactions that ended before a fetch and so makes librdkafka skip committed records."""

from __future__ import annotations

import json
import os

import pytest

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    batches_of,
    ground_truth,
    kafka_config,
    new_pipeline,
    positions,
    query,
    run_cli,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration

FINDINGS = ("last_stable_offset", "read_from_start", "read_after_abort", "read_inside_abort", "fencing")


def _verdict(cluster_suffix: str = "") -> list[tuple]:
    return query("SELECT cluster_id, reads_safe, findings FROM kafka_batch.kafka_checks WHERE cluster_id LIKE %s"
                 " ORDER BY checked_at DESC LIMIT 1", f"%{cluster_suffix}")


def test_the_sessions_broker_passes_and_the_verdict_is_recorded(services):
    result = run_cli("check-kafka")
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Kafka cluster ") and kafka_config()["bootstrap.servers"] in lines[0]
    assert [line.split()[0] for line in lines[1:-1]] == ["ok"] * len(FINDINGS)
    assert lines[-1] == "verdict recorded: batches read from it"
    cluster = lines[0].split()[2]
    [(_, safe, findings)] = query("SELECT cluster_id, reads_safe, findings FROM kafka_batch.kafka_checks"
                                  " WHERE cluster_id = %s", cluster)
    assert safe and [f["name"] for f in findings] == list(FINDINGS) and all(f["ok"] for f in findings)


def test_a_broker_that_skips_committed_records_fails_the_check_and_no_batch_reads_from_it(services):
    if not os.environ.get("KAFKA_BATCH_TEST_RAW_BROKER"):
        pytest.skip("needs the embedded noida-db without its front (the tests run against a given Kafka)")
    raw = {"AIRFLOW_CONN_RAW_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
        **kafka_config(), "bootstrap.servers": os.environ["KAFKA_BATCH_TEST_RAW_BROKER"]}})}
    pipeline = new_pipeline("unsafe", partitions=1, connections={"kafka": "raw_kafka"})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 200, seed=3)

    result = run_cli("check-kafka", "--pipeline", pipeline.name, check=False, env=raw)

    assert result.returncode == 6, (result.stdout, result.stderr)
    failed = [line for line in result.stdout.splitlines() if line.lstrip().startswith("FAIL")]
    assert failed == ["  FAIL  a read that starts after an aborted transaction of the same producer returned 0 of 3"
                      " committed records: 3 committed record(s) skipped (as when a broker lists aborted transactions"
                      " that ended before the fetch offset)"]
    assert result.stdout.splitlines()[-1] == "verdict recorded: batches refuse to read from it (exit 6) until a check passes"
    [(cluster, safe, _)] = query("SELECT cluster_id, reads_safe, findings FROM kafka_batch.kafka_checks"
                                 " WHERE cluster_id = %s", result.stdout.split()[2])
    assert not safe and not cluster.endswith("-front")  # the front is another cluster: its verdict stands

    refused = run_cli("run", "--pipeline", pipeline.name, check=False, env=raw)

    assert refused.returncode == 6 and "Traceback" not in refused.stderr, refused.stderr
    [line] = refused.stderr.splitlines()
    assert line.startswith("kafka-batch: unsafe broker: batch ") and "reads nothing and commits nothing" in line
    assert f"the transactional check of Kafka cluster {cluster} at " in line
    assert "a read that starts after an aborted transaction of the same producer returned 0 of 3" in line
    assert positions(pipeline.name) == {(topic, 0): 0}
    assert [(status, records) for _, _, status, _, records, _ in batches_of(pipeline.name)] == [("failed", None)]
    assert table_contents(pipeline) == {}

    # On a broker that passes, the same batch commits, and exactly the topic.
    pipeline = update_pipeline(pipeline.name, connections={**pipeline.connections.model_dump(), "kafka": "kafka_default"})
    run_cli("run", "--pipeline", pipeline.name)
    assert table_contents(pipeline) == ground_truth(topic)
