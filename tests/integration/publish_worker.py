"""One attempt of publishing a batch (kafka_batch.kafka.publish), in its own process so a test can
SIGKILL it at a chosen point: `python -m tests.integration.publish_worker '<json>'`.

The JSON names the pipeline, output topic, batch id, attempt, the input ranges, how many messages, which
batches Postgres has pending, the producer's `transaction_timeout_ms` (900,000 if not given), and `crash`: "producing" (half the messages delivered, transaction open),
"committed" (after the Kafka commit, before anything else), or null. Prints the decision."""

from __future__ import annotations

import json
import os
import signal
import sys

from kafka_batch import connections
from kafka_batch.kafka.publish import Decision, Message, Published, Publisher, decide
from kafka_batch.kafka.ranges import OffsetRange


def messages(batch_id: int, count: int, crash: str | None, producer):
    for i in range(count):
        if crash == "producing" and i == count // 2:
            producer.flush(30)  # half of them are on the broker, inside the open transaction
            os.kill(os.getpid(), signal.SIGKILL)
        yield Message(f"k{i}".encode(), json.dumps({"batch": batch_id, "i": i}).encode(),
                      [("kafka_batch.batch", str(batch_id).encode())])


def main(spec: dict) -> None:
    config = connections.kafka_config(connections.from_environment("kafka_default"))
    ranges = [OffsetRange(t, p, lo, hi) for t, p, lo, hi in spec["ranges"]]
    publisher = Publisher(config, spec["pipeline"], spec["topic"], timeout=30,
                          transaction_timeout_ms=spec.get("transaction_timeout_ms", 900_000))
    publisher.fence()
    found = publisher.published({(r.topic, r.partition) for r in ranges})
    decision = decide(spec["batch"], found, {int(k): v for k, v in spec.get("pending", {}).items()})
    if decision is Decision.PUBLISH:
        identity = Published(spec["batch"], spec["attempt"], "batch")
        publisher.publish(messages(spec["batch"], spec["count"], spec.get("crash"), publisher._producer),
                          identity)
        if spec.get("crash") == "committed":
            os.kill(os.getpid(), signal.SIGKILL)
    print(decision.value, flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
