"""What monitoring sees of a batch run by the CLI (kafka_batch.observability.metrics), through a real StatsD socket and
a real OTLP/HTTP receiver configured by Airflow's own AIRFLOW__METRICS__* variables, checked against the
ledger and against the topic read by a plain consumer; and `kafka-batch status --check` against the
pipeline's alerts."""

from __future__ import annotations

import socket
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from kafka_batch_dev import sample_data
from kafka_batch_dev.committed import committed_messages
from tests.integration.helpers import (
    create_topic,
    kafka_config,
    new_pipeline,
    positions,
    query,
    records_by_partition,
    run_cli,
    update_pipeline,
)
from tests.integration.otlp_listener import OtlpListener
from tests.integration.statsd_listener import StatsdListener
from tests.integration.test_end_to_end import _produce, _transactional_page_views

pytestmark = pytest.mark.integration


@pytest.fixture(params=["statsd", "otel"])
def backend(request):
    """Where Airflow's [metrics] settings point: a StatsD socket, or an OpenTelemetry (OTLP) receiver."""
    listener = StatsdListener() if request.param == "statsd" else OtlpListener()
    yield listener
    listener.close()


def _one(points, name: str, **tags) -> float:
    found = [p.value for p in points if p.name == name and all(p.tags.get(k) == str(v) for k, v in tags.items())]
    assert len(found) == 1, f"{name} {tags}: {found} in {[(p.name, p.tags) for p in points]}"
    return found[0]


def _last_stable_offsets(topic: str, partitions: list[int]) -> dict[int, int]:
    """Where a plain read_committed consumer reaches the end of each partition: its last stable offset
    (past the last transaction's marker)."""
    consumer = Consumer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "group.id": f"lso-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    ends: dict[int, int] = {}
    deadline = time.monotonic() + 120  # a partition whose end never shows fails the test, not hangs it
    try:
        while len(ends) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: no end seen for partitions {set(partitions) - set(ends)}"
            for message in consumer.consume(10_000, timeout=5):
                if message.error() and message.error().code() == KafkaError._PARTITION_EOF:
                    ends[message.partition()] = message.offset()
    finally:
        consumer.close()
    return ends


def test_a_cli_batch_sends_the_ledgers_counts_and_the_lag_kafka_shows(services, backend):
    pipeline = new_pipeline("metrics", limits={"max_records_per_batch": 600})
    topic = pipeline.topics[0]
    _produce(topic, [b"{not json"], partition=0)  # first: inside the batch's ranges
    sample_data.produce_page_views(kafka_config(), topic, 1500, seed=61)
    # After them, beyond the batch: transactions of one transactional id that aborts and commits later
    # (keys spread over the partitions), so the last stable offsets lie past their markers.
    _transactional_page_views(topic, transactions=8, size=30, seed=65)

    before = time.time()
    run_cli("run", "--pipeline", pipeline.name, env=backend.env())
    after = time.time()
    points = backend.received()

    # The batch's counts are the ledger's, and what it read is what the topic holds in its ranges.
    ranges = query("SELECT partition, from_offset, until_offset FROM kafka_batch.batch_ranges r JOIN"
                   " kafka_batch.batches b ON b.id = r.batch_id WHERE b.pipeline = %s", pipeline.name)
    topic_records = records_by_partition(topic)
    in_ranges = sum(1 for p, lo, hi in ranges for offset, _ in topic_records[p] if lo <= offset < hi)
    (valid, tombstones, invalid, attempt), = query(
        "SELECT records_read, records_tombstone, records_invalid, attempt FROM kafka_batch.batches WHERE pipeline = %s",
        pipeline.name)
    tags = {"pipeline": pipeline.name, "kind": "batch"}
    assert _one(points, "kafka_batch.batch.records_read", **tags) == valid + tombstones + invalid == in_ranges == 600
    assert _one(points, "kafka_batch.batch.records_committed", **tags) == valid + tombstones
    assert _one(points, "kafka_batch.batch.records_quarantined", **tags) == invalid == 1
    assert _one(points, "kafka_batch.batch.committed", **tags) == 1
    assert _one(points, "kafka_batch.batch.retries", **tags) == attempt - 1 == 0
    for phase in ("plan", "read", "commit", "execute"):
        assert 0 < _one(points, "kafka_batch.batch.duration", **tags, phase=phase) < (after - before) * 1000
    assert _one(points, "kafka_batch.batch.records_per_second", **tags) > 0

    # The lag per partition: the last stable offset (where a plain read_committed consumer ends) minus the
    # position; its age, that of the record at the position.
    stored = positions(pipeline.name)
    assert sum(len(r) for r in topic_records.values()) == 1501 + 6 * 30  # two of the eight transactions aborted
    ends = _last_stable_offsets(topic, list(topic_records))
    for partition, records in topic_records.items():
        where = {"pipeline": pipeline.name, "topic": topic, "partition": partition}
        position = stored.get((topic, partition), 0)
        assert _one(points, "kafka_batch.lag.records", **where) == ends[partition] - position > 0
        age = _one(points, "kafka_batch.lag.seconds", **where)
        written = dict(records)[position] / 1000  # a page view: the batch stopped inside them
        assert before - written - 1 <= age <= after - written + 1
    # And per topic, first: the sum over its partitions, the oldest of their ages, how many are behind.
    where = {"pipeline": pipeline.name, "topic": topic}
    assert _one(points, "kafka_batch.topic.lag.records", **where) == sum(
        ends[p] - stored.get((topic, p), 0) for p in topic_records)
    assert _one(points, "kafka_batch.topic.lag.seconds", **where) == max(
        _one(points, "kafka_batch.lag.seconds", **where, partition=p) for p in topic_records)
    assert _one(points, "kafka_batch.topic.partitions_behind", **where) == len(topic_records)


def test_a_publishing_batch_sends_its_messages_per_topic_and_its_publish_time(services):
    output = f"metricspub_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 2)
    pipeline = new_pipeline("metricspub", sinks={"kafka": {"topic": output, "value": {"page": "page"}}})
    _produce(pipeline.topics[0], [b"{not json"], partition=0)  # quarantined: never published
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 300, seed=66)
    listener = StatsdListener()
    try:
        before = time.time()
        run_cli("run", "--pipeline", pipeline.name, env=listener.env())
        after = time.time()
        points = listener.received()
    finally:
        listener.close()
    tags = {"pipeline": pipeline.name, "kind": "batch"}
    in_topic = sum(1 for _ in committed_messages(kafka_config(), output))
    assert _one(points, "kafka_batch.batch.messages_published", **tags, topic=output) == in_topic == 300
    assert 0 < _one(points, "kafka_batch.batch.duration", **tags, phase="publish") < (after - before) * 1000


def test_status_check_fails_over_the_alerts_with_one_line(services):
    pipeline = new_pipeline("alerts", limits={"max_records_per_batch": 100})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 400, seed=62)
    unchecked = run_cli("status", "--pipeline", pipeline.name, "--check", check=False)
    assert unchecked.returncode == 2 and "defines no alerts" in unchecked.stderr

    update_pipeline(pipeline.name, alerts={"max_lag_records": 399})
    behind = run_cli("status", "--pipeline", pipeline.name, "--check", check=False)
    assert behind.returncode == 7, behind.stderr
    assert behind.stderr.strip().splitlines() == [
        f"kafka-batch: pipeline {pipeline.name} is behind: lag 400 records over max_lag_records 399"]

    run_cli("run", "--pipeline", pipeline.name)  # 100 read: 300 behind, under the bound
    assert run_cli("status", "--pipeline", pipeline.name, "--check").returncode == 0

    # The oldest unread record's age: the sample's records carry times of the past.
    update_pipeline(pipeline.name, alerts={"max_lag_seconds": 1})
    aged = run_cli("status", "--pipeline", pipeline.name, "--check", "--json", check=False)
    assert aged.returncode == 7 and "over max_lag_seconds 1" in aged.stderr


def test_metrics_that_cannot_be_sent_never_fail_a_batch(services):
    pipeline = new_pipeline("nometrics")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 200, seed=63)
    result = run_cli("run", "--pipeline", pipeline.name, env={
        "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "statsd.invalid"})
    assert sum(positions(pipeline.name).values()) == 200
    assert result.stderr.count("metrics: StatsD at statsd.invalid:8125 unusable") == 1, result.stderr

    # An OpenTelemetry receiver that is not there: the batch commits, and one line names where.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 100, seed=64)
    result = run_cli("run", "--pipeline", pipeline.name, env={
        "AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__OTEL_PORT": str(port)})
    assert sum(positions(pipeline.name).values()) == 300
    down = [line for line in result.stderr.splitlines() if "metrics" in line.lower() or "export" in line.lower()]
    assert len(down) == 1 and f"OpenTelemetry at http://127.0.0.1:{port}/v1/metrics did not take" in down[0], down
