"""How an overview asks Kafka for many pipelines at once (pure logic: a stand-in counts the questions
that the real client would send): each topic's partitions once, every pipeline's offsets in one listing,
and a pipeline whose topic fails keeps its error to itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kafka_batch.core.inspection import _AskedOnce
from kafka_batch.errors import InputError
from kafka_batch.kafka.source import PartitionOffsets


class Counting:
    def __init__(self, topics: dict[str, int]):
        self.topics, self.asked = topics, []

    def partitions(self, topics, pattern=None):
        self.asked.append(("partitions", tuple(topics)))
        if any(t not in self.topics for t in topics):
            raise InputError(f"topic {topics[0]!r} does not exist")
        return [(t, p) for t in topics for p in range(self.topics[t])]

    def offsets(self, partitions):
        self.asked.append(("offsets", len(partitions)))
        return {tp: PartitionOffsets(0, 10) for tp in partitions}


def pipeline(*topics):
    return SimpleNamespace(topics=topics, topic_pattern=None)


def test_each_topic_once_and_one_listing_for_every_pipeline():
    kafka = Counting({"a": 3, "b": 2})
    pipelines = [pipeline("a"), pipeline("a"), pipeline("b"), pipeline("a", "b")]
    asked = _AskedOnce(kafka, pipelines)
    assert kafka.asked == [("partitions", ("a",)), ("partitions", ("b",)), ("partitions", ("a", "b")), ("offsets", 5)]
    answers = {p.topics: asked.offsets(asked.partitions(p.topics)) for p in pipelines}
    assert kafka.asked[4:] == []  # every pipeline's answer came from those four questions
    assert sorted(answers[("a", "b")]) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert sorted(answers[("b",)]) == [("b", 0), ("b", 1)]


def test_a_pipeline_whose_topic_fails_is_asked_again_alone():
    kafka = Counting({"a": 1})
    asked = _AskedOnce(kafka, [pipeline("a"), pipeline("gone")])
    assert asked.offsets(asked.partitions(("a",))) == {("a", 0): PartitionOffsets(0, 10)}
    with pytest.raises(InputError, match="'gone' does not exist"):
        asked.partitions(("gone",))
