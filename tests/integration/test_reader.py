"""The range reader against a real broker and a real librdkafka consumer: transactions and markers.

Offsets are laid out by a transactional producer, so the expectations are known by construction:
committed records are visible, aborted ones are not, and every marker takes one offset.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from kafka_batch.errors import ServiceError
from kafka_batch.kafka.ranges import OffsetRange, PartitionState, plan_ranges
from kafka_batch.kafka.source import KafkaOffsets, read_partitions, read_range
from tests.integration.helpers import create_topic, kafka_config, records_by_partition

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
        (7, 9, [7]),         # starts after an aborted transaction of the same producer
        (5, 9, [7]),         # starts inside it
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


@pytest.mark.parametrize(("start", "until"), [(0, 4), (3, 7), (4, 6), (6, 9), (8, 9)])
def test_ranges_on_markers_end_without_waiting_out_the_poll_timeout(transactional_topic, start, until):
    """Markers leave fewer records than offsets: the read must not wait for the missing ones."""
    topic, _ = transactional_topic
    started = time.monotonic()
    for _ in read_range(kafka_config(), OffsetRange(topic, 0, start, until), poll_timeout=30, stall_timeout=60):
        pass
    assert time.monotonic() - started < 15  # a read waiting for offsets without records takes >= 30 s


@pytest.fixture(params=["one transactional id", "two transactional ids"])
def transactional_partitions(services, request):
    """Three partitions written by committed and aborted transactions (markers in each), then plain
    records on partition 2; returns the topic, each partition's end and the (partition, offset) of every
    committed record, from the delivery reports. One producer commits and aborts
    (as exactly-once producers do), or a second one aborts."""
    topic = f"txn3_{uuid.uuid4().hex[:8]}"
    create_topic(topic, 3)
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "transactional.id": topic})
    producer.init_transactions(30)
    aborter = producer
    if request.param == "two transactional ids":
        aborter = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "transactional.id": topic + "_a"})
        aborter.init_transactions(30)
    committed: set[tuple[int, int]] = set()
    for n in range(4):
        for p, txn in ((producer, True), (aborter, False)):
            delivered: set[tuple[int, int]] = set()
            p.begin_transaction()
            for i in range(5 + n):
                p.produce(topic, value=f"{txn}-{n}-{i}".encode(), partition=i % 3,
                          on_delivery=lambda _, m, into=delivered: into.add((m.partition(), m.offset())))
            p.flush(30)
            p.commit_transaction() if txn else p.abort_transaction()
            committed |= delivered if txn else set()
    plain = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    for i in range(7):
        plain.produce(topic, value=f"plain-{i}".encode(), partition=2,
                      on_delivery=lambda _, m: committed.add((m.partition(), m.offset())))
    plain.flush(30)
    ends = KafkaOffsets(kafka_config()).offsets([(topic, p) for p in range(3)])
    return topic, {p: ends[(topic, p)].last_stable for p in range(3)}, committed


def _truth(topic: str, ranges: list[OffsetRange]) -> set[tuple[int, int, int]]:
    """(range_id, partition, offset) of every committed record in the ranges, read by a plain consumer."""
    found = records_by_partition(topic)
    return {(r.range_id, r.partition, offset) for r in ranges for offset, _ in found[r.partition]
            if r.from_offset <= offset < r.until_offset}


def _marker_ranges(topic: str, ends: dict[int, int]) -> list[OffsetRange]:
    """Partition 0 up to its end (the last offset is a marker), partition 1 from a marker to an offset
    before its end, partition 2 whole; all read by one consumer."""
    return [OffsetRange(topic, 0, 0, ends[0], range_id=1), OffsetRange(topic, 1, 2, ends[1] - 3, range_id=2),
            OffsetRange(topic, 2, 0, ends[2], range_id=3)]


def test_one_consumer_reads_ranges_of_several_partitions_as_the_ground_truth(transactional_partitions):
    topic, ends, _ = transactional_partitions
    ranges = _marker_ranges(topic, ends)
    read = [(r.range_id, m.partition(), m.offset())
            for r, batch in read_partitions(kafka_config(), ranges, batch_size=4, poll_timeout=30, stall_timeout=60)
            for m in batch]  # a record under another partition's range would not be in the truth
    assert len(read) == len(set(read))
    read = set(read)
    truth = _truth(topic, ranges)
    assert read == truth and len(truth) > 20
    # Ranges that hold only markers and aborted records, side by side with one that has records.
    only_markers = [OffsetRange(topic, 0, ends[0] - 1, ends[0], range_id=1), OffsetRange(topic, 2, 1, 3, range_id=3),
                    OffsetRange(topic, 1, 0, 5, range_id=2)]
    read = [(m.partition(), m.offset()) for _, b in read_partitions(kafka_config(), only_markers, poll_timeout=30,
                                                                       stall_timeout=60) for m in b]
    truth = _truth(topic, only_markers)
    assert sorted(read) == sorted((p, o) for _, p, o in truth) and {p for _, p, _ in truth} == {1}


def test_packed_spark_tasks_read_every_range_once(transactional_partitions, spark):
    """Many small ranges packed into few Spark tasks (one consumer per task) read exactly the records
    a plain consumer sees, each with its own range id."""
    from kafka_batch.config import ReadSettings
    from kafka_batch.kafka.ranges import pack_tasks, split_for_tasks
    from kafka_batch.spark.reader import read_ranges

    topic, ends, _ = transactional_partitions
    pieces = split_for_tasks(_marker_ranges(topic, ends), max_records_per_task=6)
    tasks = pack_tasks(pieces, max_records_per_task=40, slots=2)
    assert len(tasks) < len(pieces) and any(len({(r.topic, r.partition) for r in t}) > 1 for t in tasks)
    records = read_ranges(spark, kafka_config(), tasks, ReadSettings(poll_timeout_seconds=30))
    assert records.rdd.getNumPartitions() == len(tasks)
    rows = [(r["range_id"], r["partition"], r["offset"]) for r in records.select("range_id", "partition", "offset").collect()]
    assert len(rows) == len(set(rows))
    assert set(rows) == _truth(topic, pieces)


def test_a_read_from_any_offset_returns_every_committed_record_after_it(transactional_partitions):
    """Reads that start anywhere (before, inside and after aborted transactions of the same producer)
    against what the producers' delivery reports say was committed."""
    topic, ends, committed = transactional_partitions
    for start in range(max(ends.values()) + 1):
        ranges = [OffsetRange(topic, p, min(start, end), end, range_id=p + 1) for p, end in ends.items()]
        read = {(m.partition(), m.offset()) for _, chunk in read_partitions(
            kafka_config(), ranges, poll_timeout=30, stall_timeout=60) for m in chunk}
        assert read == {(p, o) for p, o in committed if o >= min(start, ends[p])}, f"reading from {start}"
