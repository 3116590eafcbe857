"""How one consume call's records are split by partition (pure logic, on Messages built by hand)."""

from __future__ import annotations

from confluent_kafka import Message

from kafka_batch.kafka.source import _by_partition


def records(*runs):
    """Messages in runs of (topic, partition, number of records), offsets counting up per partition."""
    made, next_offset = [], {}
    for topic, partition, count in runs:
        for _ in range(count):
            offset = next_offset.get((topic, partition), 0)
            next_offset[(topic, partition)] = offset + 1
            made.append(Message(topic=topic, partition=partition, offset=offset))
    return made


def split(messages, topics):
    return {key: [m.offset() for m in chunk] for key, chunk in _by_partition(messages, topics).items()}


def test_runs_of_one_topic_come_back_per_partition_in_offset_order():
    messages = records(("a", 0, 3), ("a", 1, 2), ("a", 0, 2), ("a", 2, 1), ("a", 1, 1))
    assert split(messages, {"a"}) == {("a", 0): [0, 1, 2, 3, 4], ("a", 1): [0, 1, 2], ("a", 2): [0]}


def test_partitions_of_the_same_number_in_two_topics_stay_apart():
    messages = records(("a", 0, 2), ("b", 0, 2), ("a", 0, 1), ("b", 1, 1))
    assert split(messages, {"a", "b"}) == {("a", 0): [0, 1, 2], ("b", 0): [0, 1], ("b", 1): [0]}


def test_no_records_no_partitions():
    assert split([], {"a"}) == {} and split([], {"a", "b"}) == {}
