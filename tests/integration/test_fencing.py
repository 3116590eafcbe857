"""Fencing zombies (the KIP-618 idea): an attempt whose token is no longer current stops and never commits."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from kafka_batch import connections
from kafka_batch.core import attempts
from kafka_batch.errors import FencedAttempt
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.spark.job import run_batch
from tests.integration.helpers import batches_of, create_topic, kafka_config, new_pipeline, positions, store_connection
from tests.integration.test_core import _plan

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("fence", ["newer attempt", "superseded"])
def test_a_zombie_attempt_stops_early_when_fenced(services, spark, fence):
    """A newer attempt (an Airflow retry) or a newer plan (the batch superseded) stops a running attempt."""
    topic = f"zombie_{uuid.uuid4().hex[:8]}"
    create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(5):
        producer.produce(topic, value=b'{"user_id": "u", "page": "/", "duration_ms": %d}' % n, partition=0)
    producer.commit_transaction()  # offsets 0-4, marker at 5
    producer.begin_transaction()
    producer.produce(topic, value=b'{"user_id": "u", "page": "/", "duration_ms": 9}', partition=0)
    producer.flush(30)  # offset 6, left open: a read up to 8 cannot finish before the stall timeout

    pipeline = new_pipeline("zombie", partitions=0, topics=[topic],
                            read={"stall_timeout_seconds": 90, "fence_check_seconds": 1})
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 8)])
    postgres = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
    outcome: dict = {}

    def zombie():
        started = time.monotonic()
        try:
            run_batch(spark, postgres, batch.id, kafka_config=lambda _: kafka_config())
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=zombie)
    thread.start()
    while attempts.current_attempt(conn, batch.id)[0] != 1:
        time.sleep(0.2)
    time.sleep(3)  # the first attempt is reading
    if fence == "newer attempt":
        assert attempts.claim_attempt(conn, batch.id) == 2  # what an Airflow retry does when it starts
        expected, status = "the batch is now attempt 2 (planned)", "planned"  # the newer attempt still owns it
    else:
        _plan(conn, pipeline, "r2", [OffsetRange(topic, 0, 0, 6)])  # a newer plan supersedes the batch
        expected, status = "the batch is now attempt 1 (superseded)", "superseded"
    thread.join(timeout=120)
    producer.abort_transaction()

    assert isinstance(outcome["error"], FencedAttempt), outcome
    assert f"attempt 1 stopped early, {expected}" in str(outcome["error"])
    assert outcome["seconds"] < 60  # well before the 90 s stall timeout
    assert batches_of(pipeline.name)[0][2] == status
    assert positions(pipeline.name) == {(topic, 0): 0}
    conn.close()
