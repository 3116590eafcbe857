"""The plain exactly-once publisher `make bench` measures the Kafka sink against: Kafka's own
consume-transform-produce pattern (KIP-98/KIP-447), as a user would write it in Python.

consume the ranges (scripts/bench/peers/plain_consumer.py's loop), json.loads each value, produce the projection
(key user_id; value {page, duration_ms}) to the output topic, and every 10,000 records commit the
transaction with the input offsets (`send_offsets_to_transaction`). With `--lineage PIPELINE:BATCH`
each message also carries the lineage headers the project's Kafka sink writes by default (the pipeline,
the batch, its kind, the source record and its range), as a user who needs them would add them: the
same messages as the sink's. It imports nothing of the project:

    python scripts/bench/peers/plain_publisher.py --kafka '{"bootstrap.servers": ...}' --ranges '[["topic", 0, 0, 1000]]' \
        --output bench_out [--lineage pipeline:42]
"""

from __future__ import annotations

import argparse
import json
import uuid

from confluent_kafka import Producer, TopicPartition
from plain_consumer import consume, consumer  # beside this file

EVERY = 10_000


def run(kafka: dict, ranges: list[tuple[str, int, int, int]], output: str, lineage: str | None = None) -> int:
    c = consumer(kafka, ranges)
    producer = Producer({"bootstrap.servers": kafka["bootstrap.servers"], "linger.ms": 5,
                         "transactional.id": f"bench-plain-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    batch = range_of = None
    if lineage:
        pipeline, batch_id = lineage.rsplit(":", 1)
        batch = [("kafka_batch.pipeline", pipeline), ("kafka_batch.batch", batch_id), ("kafka_batch.kind", "batch")]
        range_of = {(t, p): ("kafka_batch.range", f"{t}:{p}:{start}-{until}") for t, p, start, until in ranges}
    count, pending, reached = 0, 0, {}
    for m in consume(c, ranges):
        count += 1
        reached[(m.topic(), m.partition())] = m.offset() + 1
        if m.value() is not None:
            record = json.loads(m.value())
            value = json.dumps({"page": record["page"], "duration_ms": record["duration_ms"]})
            headers = None if batch is None else [
                *batch, ("kafka_batch.source", f"{m.topic()}:{m.partition()}:{m.offset()}"),
                range_of[(m.topic(), m.partition())]]
            while True:
                try:
                    producer.produce(output, key=record["user_id"], value=value, headers=headers)
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
    parser.add_argument("--lineage", metavar="PIPELINE:BATCH", help="add the Kafka sink's lineage headers")
    args = parser.parse_args()
    print(run(json.loads(args.kafka), [tuple(r) for r in json.loads(args.ranges)], args.output, args.lineage))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
