"""The range reader against a real broker and a real librdkafka consumer: transactions and markers.

Offsets are laid out by a transactional producer, so the expectations are known by construction:
committed records are visible, aborted ones are not, and every marker takes one offset.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from kafka_batch.core.ranges import OffsetRange, PartitionState, plan_ranges
from kafka_batch.errors import ServiceError
from kafka_batch.kafka_source import KafkaOffsets, read_range
from tests.integration.helpers import create_topic, kafka_config

pytestmark = pytest.mark.integration


def _transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction()
    else:
        producer.abort_transaction()


def _offsets(topic: str, r: OffsetRange) -> list[int]:
    return [m.offset() for batch in read_range(kafka_config(), r, stall_timeout=20) for m in batch]


@pytest.fixture
def transactional_topic(services):
    """Offsets: 0-2 committed, 3 marker, 4-5 aborted, 6 marker, 7 committed, 8 marker, then 9 open."""
    topic = f"txn_{uuid.uuid4().hex[:8]}"
    create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "transactional.id": topic})
    producer.init_transactions(30)
    _transaction(producer, topic, [b"c0", b"c1", b"c2"], commit=True)
    _transaction(producer, topic, [b"a4", b"a5"], commit=False)
    _transaction(producer, topic, [b"c7"], commit=True)
    producer.begin_transaction()
    producer.produce(topic, value=b"open9", partition=0)
    producer.flush(30)
    yield topic, producer
    producer.abort_transaction()


def test_open_transaction_bounds_the_plan_and_aborted_records_are_skipped(transactional_topic):
    topic, producer = transactional_topic
    offsets = KafkaOffsets(kafka_config()).offsets([(topic, 0)])[(topic, 0)]
    assert offsets.last_stable == 9  # not the high watermark (10): the open transaction stays out
    [planned] = plan_ranges([PartitionState(topic, 0, 0, offsets.log_start, offsets.last_stable)], 100, 100)
    assert (planned.from_offset, planned.until_offset) == (0, 9)
    assert _offsets(topic, planned) == [0, 1, 2, 7]


@pytest.mark.parametrize(
    ("start", "until", "expected"),
    [
        (0, 4, [0, 1, 2]),   # the last offset of the range is the commit marker at 3
        (0, 3, [0, 1, 2]),   # ends just before the commit marker
        (3, 7, []),          # only a marker, aborted records and the abort marker: valid and empty
        (4, 6, []),          # only aborted records
        (6, 9, [7]),         # starts on a marker, ends after the last marker
        (8, 9, []),          # only the final commit marker
    ],
)
def test_ranges_on_markers_complete_without_hanging(transactional_topic, start, until, expected):
    topic, _ = transactional_topic
    assert _offsets(topic, OffsetRange(topic, 0, start, until)) == expected


def test_a_read_that_cannot_progress_fails_naming_where(transactional_topic):
    topic, _ = transactional_topic
    # Offset 9 is in the open transaction: a read_committed consumer cannot pass the last stable offset.
    with pytest.raises(ServiceError, match=rf"{topic}\[0\]: no progress for 3s at offset 9, expected to read up to 10"):
        for _ in read_range(kafka_config(), OffsetRange(topic, 0, 0, 10), stall_timeout=3):
            pass
