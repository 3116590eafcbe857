"""The plain exactly-once publisher `make bench` measures the Kafka sink against: Kafka's own
consume-transform-produce pattern (KIP-98/KIP-447), as a user would write it in Python.

consume the ranges (scripts/plain_consumer.py's loop), json.loads each value, produce the projection
(key user_id; value {page, duration_ms}) to the output topic, and every 10,000 records commit the
transaction with the input offsets (`send_offsets_to_transaction`). It imports nothing of the project:

    python scripts/plain_publisher.py --kafka '{"bootstrap.servers": ...}' --ranges '[["topic", 0, 0, 1000]]' \
        --output bench_out
"""

from __future__ import annotations

import argparse
import json
import uuid

from confluent_kafka import Producer, TopicPartition
from plain_consumer import consume, consumer  # scripts/, beside this file

EVERY = 10_000


def run(kafka: dict, ranges: list[tuple[str, int, int, int]], output: str) -> int:
    c = consumer(kafka, ranges)
    producer = Producer({"bootstrap.servers": kafka["bootstrap.servers"], "linger.ms": 5,
                         "transactional.id": f"bench-plain-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    count, pending, reached = 0, 0, {}
    for m in consume(c, ranges):
        count += 1
        reached[(m.topic(), m.partition())] = m.offset() + 1
        if m.value() is not None:
            record = json.loads(m.value())
            value = json.dumps({"page": record["page"], "duration_ms": record["duration_ms"]})
            while True:
                try:
                    producer.produce(output, key=record["user_id"], value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
        pending += 1
        if pending == EVERY:
            _commit(producer, c, reached)
            producer.begin_transaction()
            pending = 0
    _commit(producer, c, reached)
    c.close()
    return count


def _commit(producer: Producer, c, reached: dict) -> None:
    offsets = [TopicPartition(t, p, o) for (t, p), o in reached.items()]
    producer.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), 30)
    producer.commit_transaction(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka", required=True, help="librdkafka settings, JSON")
    parser.add_argument("--ranges", required=True, help="[[topic, partition, from, until], ...], JSON")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    print(run(json.loads(args.kafka), [tuple(r) for r in json.loads(args.ranges)], args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
