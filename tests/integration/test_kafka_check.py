"""The transactional check of a Kafka cluster (`kafka-batch check-kafka`) and the refusal of batches to read
from a cluster that failed it: the session's broker passes; a second node whose recorded verdict is the one a
broker that skips committed records gets is refused until a check of it passes."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_batch import connections
from kafka_batch.core import database, kafka_checks
from kafka_batch.kafka import check
from kafka_batch.kafka.check import Finding, KafkaCheck
from kafka_batch.kafka.source import KafkaOffsets
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


def test_a_cluster_whose_check_failed_is_refused_until_a_check_passes(second_cluster):
    other = {"AIRFLOW_CONN_OTHER_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
        **kafka_config(), "bootstrap.servers": second_cluster}})}
    pipeline = new_pipeline("unsafe", partitions=1, connections={"kafka": "other_kafka"})
    topic = pipeline.topics[0]
    admin = AdminClient({"bootstrap.servers": second_cluster})  # kept: its futures end with it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    sample_data.produce_page_views({"bootstrap.servers": second_cluster}, topic, 200, seed=3)
    # The verdict a check gives a broker that drops a producer's committed records after its abort (as a
    # Kafka-protocol server did that listed aborted transactions ended before the fetch).
    cluster = KafkaOffsets({"bootstrap.servers": second_cluster}).cluster_id()
    skipped = check._wrong("a read that starts after an aborted transaction of the same producer", set(),
                                 {7, 8, 9}, [3, 4, 5])
    findings = (Finding("read_after_abort", False, skipped, reads=True), Finding("fencing", True, "fenced", reads=False))
    conn = database.connect(connections.postgres_params(connections.from_environment("kafka_batch_postgres")))
    try:
        kafka_checks.record(conn, KafkaCheck(cluster, second_cluster, findings))
    finally:
        conn.close()

    refused = run_cli("run", "--pipeline", pipeline.name, check=False, env=other)

    assert refused.returncode == 6 and "Traceback" not in refused.stderr, refused.stderr
    [line] = refused.stderr.splitlines()
    assert line.startswith("kafka-batch: unsafe broker: batch ") and "reads nothing and commits nothing" in line
    assert f"the transactional check of Kafka cluster {cluster} at " in line
    assert ("a read that starts after an aborted transaction of the same producer returned 0 of 3 committed"
            " records: 3 committed record(s) skipped") in line
    assert positions(pipeline.name) == {(topic, 0): 0}
    assert [(status, records) for _, _, status, _, records, _ in batches_of(pipeline.name)] == [("failed", None)]
    assert table_contents(pipeline) == {}

    # The cluster checked again (it is Apache Kafka: it passes), the next batch commits exactly the topic.
    result = run_cli("check-kafka", "--pipeline", pipeline.name, env=other)
    assert result.stdout.splitlines()[-1] == "verdict recorded: batches read from it"
    run_cli("run", "--pipeline", pipeline.name, env=other)
    assert table_contents(pipeline) == ground_truth(topic, config={"bootstrap.servers": second_cluster})
