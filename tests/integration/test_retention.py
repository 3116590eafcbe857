"""Retention overtaking the stored position, under both policies, against the real broker.

`delete_records` moves the log start exactly as retention does; Kafka's own retention deletes whole
segments by time. Ground truth is read from the topic before and after each deletion, so the expected
totals never come from our own code.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kafka_batch.errors import DataLossError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.kafka.source import read_range
from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    admin_client,
    batches_of,
    create_topic,
    delete_records,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    positions,
    query,
    run_cli,
    table_contents,
    update_pipeline,
)
from tests.integration.test_kafka_sink import _output

pytestmark = pytest.mark.integration


def _data_loss(pipeline_name: str) -> list[tuple]:
    return query(
        "SELECT d.topic, d.partition, d.lost_from, d.lost_until, b.run_id FROM kafka_batch.data_loss d"
        " JOIN kafka_batch.batches b ON b.id = d.batch_id WHERE d.pipeline = %s ORDER BY d.lost_from",
        pipeline_name,
    )


def _batch_status(pipeline_name: str, run_id: str) -> str:
    return {run: status for _, _, status, run, _, _ in batches_of(pipeline_name)}[run_id]


def _produce(topic: str, count: int, seed: int) -> None:
    sample_data.produce_page_views(kafka_config(), topic, count, seed=seed)


def test_data_loss_fails_by_default_and_is_recorded_under_skip(services):
    pipeline = new_pipeline("loss", partitions=1)
    topic = pipeline.topics[0]
    _produce(topic, 100, seed=1)
    run_cli("run", "--pipeline", pipeline.name)
    first = ground_truth(topic)
    assert table_contents(pipeline) == first and positions(pipeline.name) == {(topic, 0): 100}

    # Planned, then deleted before the job runs: the job checks again before Spark starts.
    _produce(topic, 100, seed=2)
    run_cli("plan", "--pipeline", pipeline.name, "--run-id", "r2")
    delete_records(topic, 0, 130)
    with pytest.raises(DataLossError, match=rf"{topic}\[0\] range 100..140 at offset 100: offset out of range"):
        for _ in read_range(kafka_config(), OffsetRange(topic, 0, 100, 140)):
            pass
    failed = run_cli("run", "--pipeline", pipeline.name, "--run-id", "r2", check=False)
    assert failed.returncode != 0
    assert "stored position 100" in failed.stderr and "earliest available offset is now 130" in failed.stderr
    assert _batch_status(pipeline.name, "r2") == "failed"
    assert positions(pipeline.name) == {(topic, 0): 100} and table_contents(pipeline) == first
    assert _data_loss(pipeline.name) == []

    # The failed batch keeps the definition it was planned with: retrying it fails the same way.
    assert run_cli("run", "--pipeline", pipeline.name, "--run-id", "r2", check=False).returncode == 5
    # The operator accepts the loss: the next run plans with the policy in force, past the gap, and
    # records it; the failed batch is superseded.
    second = ground_truth(topic)  # offsets 130..200
    update_pipeline(pipeline.name, on_data_loss="skip")
    run_cli("run", "--pipeline", pipeline.name, "--run-id", "r2-accepted")
    assert _batch_status(pipeline.name, "r2") == "superseded"
    assert positions(pipeline.name) == {(topic, 0): 200}
    assert table_contents(pipeline) == merged(first, second)
    assert _data_loss(pipeline.name) == [(topic, 0, 100, 130, "r2-accepted")]

    # Deleted before planning: the planner plans past the gap and the commit records it.
    _produce(topic, 100, seed=3)
    delete_records(topic, 0, 250)
    third = ground_truth(topic)  # offsets 250..300
    run_cli("run", "--pipeline", pipeline.name, "--run-id", "r3")
    assert positions(pipeline.name) == {(topic, 0): 300}
    assert table_contents(pipeline) == merged(first, second, third)
    assert _data_loss(pipeline.name) == [(topic, 0, 100, 130, "r2-accepted"), (topic, 0, 200, 250, "r3")]

    # Back to `fail`: the planner refuses, nothing is planned or changed.
    update_pipeline(pipeline.name, on_data_loss="fail")
    _produce(topic, 50, seed=4)
    delete_records(topic, 0, 320)
    refused = run_cli("run", "--pipeline", pipeline.name, "--run-id", "r4", check=False)
    assert refused.returncode == 5  # data loss: an operator decides, never retried
    assert f"{topic}[0]: data loss: stored position 300 is below the earliest available offset 320" in refused.stderr
    assert positions(pipeline.name) == {(topic, 0): 300}
    assert table_contents(pipeline) == merged(first, second, third)
    assert "r4" not in {run for _, _, _, run, _, _ in batches_of(pipeline.name)}


def _log_start(topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "group.id": "log-start"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    finally:
        consumer.close()


def _set_retention_ms(topic: str, value: str) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)])
    admin = admin_client()  # kept while its futures run: they end with it
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()


def test_segments_deleted_by_retention_before_they_were_read_are_data_loss_under_both_policies(services):
    """Kafka's retention, not a deletion of ours: once a topic's retention.ms is lowered below its records'
    age, its closed segments of such records go at the broker's next retention check, and the log then
    starts where the broker says (the active segment's first offset)."""
    pipeline = new_pipeline("retained", partitions=0)
    topic = pipeline.topics[0]
    create_topic(topic, 1, {"segment.ms": "1000"})  # a segment closes at the first append a second after it opened
    hour = 3_600_000
    now = int(time.time() * 1000)
    sample_data.produce_page_views(kafka_config(), topic, 100, seed=11, start_ms=now - 3 * hour)
    run_cli("run", "--pipeline", pipeline.name)
    first = ground_truth(topic)
    time.sleep(1.5)
    sample_data.produce_page_views(kafka_config(), topic, 100, seed=12, start_ms=now - 2 * hour)  # a segment
    time.sleep(1.5)
    _produce(topic, 100, seed=13)  # recent records, in the segment that closes the one before

    _set_retention_ms(topic, str(hour))  # the two closed segments hold records older than that
    deadline = time.monotonic() + 60
    while (start := _log_start(topic)) <= 100:
        assert time.monotonic() < deadline, "retention deleted nothing within 60 s"
        time.sleep(0.5)
    assert start == 200  # the first offset of the segment retention kept

    refused = run_cli("run", "--pipeline", pipeline.name, "--run-id", "kept", check=False)
    assert refused.returncode == 5, refused.stderr
    assert (f"{topic}[0]: data loss: stored position 100 is below the earliest available offset {start}"
            in refused.stderr)
    assert positions(pipeline.name) == {(topic, 0): 100} and table_contents(pipeline) == first

    rest = ground_truth(topic)  # what retention left: offsets start..300
    update_pipeline(pipeline.name, on_data_loss="skip")
    run_cli("run", "--pipeline", pipeline.name, "--run-id", "accepted")
    assert positions(pipeline.name) == {(topic, 0): 300}
    assert table_contents(pipeline) == merged(first, rest)
    assert _data_loss(pipeline.name) == [(topic, 0, 100, start, "accepted")]


def test_a_publishing_pipelines_refused_batch_is_superseded_once_the_loss_is_accepted(services):
    """A pipeline with a Kafka sink keeps an unfinished batch only while its output is in Kafka (a new plan
    would publish its records again). One refused for data loss never published: once the operator
    accepts the loss, the next plan supersedes it and reads past the gap, and the output topic holds every
    surviving record once."""
    output = f"losspub_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 1)
    pipeline = new_pipeline("losspub", partitions=1, sinks={"kafka": {"topic": output, "key": "user_id",
                                                                      "value": {"page": "page"}}})
    topic = pipeline.topics[0]
    _produce(topic, 100, seed=21)
    run_cli("run", "--pipeline", pipeline.name)
    first = ground_truth(topic)
    _produce(topic, 100, seed=22)
    run_cli("plan", "--pipeline", pipeline.name, "--run-id", "r2")
    delete_records(topic, 0, 130)
    assert run_cli("run", "--pipeline", pipeline.name, "--run-id", "r2", check=False).returncode == 5
    assert run_cli("run", "--pipeline", pipeline.name, check=False).returncode == 5  # a new run, the same refusal

    second = ground_truth(topic)  # offsets 130..200
    update_pipeline(pipeline.name, on_data_loss="skip")
    run_cli("run", "--pipeline", pipeline.name, "--run-id", "r2-accepted")
    assert _batch_status(pipeline.name, "r2") == "superseded"
    assert positions(pipeline.name) == {(topic, 0): 200}
    assert _data_loss(pipeline.name) == [(topic, 0, 100, 130, "r2-accepted")]
    assert table_contents(pipeline) == merged(first, second)
    sources = Counter(m["kafka_batch.source"] for m in _output(output, partitions=[0]))
    assert sources == Counter(f"{topic}:0:{offset}" for offset in [*range(100), *range(130, 200)])
