"""The ground truth's reader: a topic's committed records as a plain `read_committed` consumer sees them.

Tests, `make chaos` and the demos check the pipeline against what this reads: confluent-kafka alone,
none of the project's own reading code, so a fault in that code cannot hide itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

# What a client of the tools takes over from a cluster's settings: where it is and how to authenticate.
_CLIENT_PREFIXES = ("bootstrap.servers", "security.", "sasl.", "ssl.")


def client_settings(config: Mapping) -> dict:
    """A cluster's address and credentials out of a pipeline's librdkafka settings, for the tools' own plain
    clients (the ground truth's reader, sample producers, admin clients)."""
    return {k: v for k, v in config.items() if k.startswith(_CLIENT_PREFIXES)}


def committed_messages(config: Mapping, topic: str, partitions: Iterable[int] | None = None,
                       below: Mapping[int, int] | None = None) -> Iterator[Message]:
    """Every committed record (tombstones too) of the topic's partitions (default: all), in each
    partition's order, from its log start to its end, or to `below` (partition -> offset; the
    partitions it names, those at 0 skipped). Aborted records and transaction markers never show."""
    consumer = Consumer({**client_settings(config),
                         "group.id": f"truth-{uuid.uuid4().hex}", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False,
                         "fetch.wait.max.ms": 50})  # it ends at the partition's end: no long wait for more
    if below is not None:
        ends = {p: end for p, end in below.items() if end > 0}
    else:
        if partitions is None:
            partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = dict.fromkeys(partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(ends)])
    done: set[int] = set()
    try:
        while len(done) < len(ends):
            # consume() waits its whole timeout unless 10,000 messages come: short, so that a small topic's
            # read ends soon after its partitions' ends (it took 5 s a topic).
            for message in consumer.consume(10_000, timeout=0.2):
                partition = message.partition()
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(message.error())
                    done.add(partition)
                elif ends[partition] is not None and message.offset() >= ends[partition]:
                    done.add(partition)
                else:
                    done.discard(partition)  # more arrived after its end was reached
                    yield message
    finally:
        consumer.close()
