"""A batch's output published to Kafka exactly once (kafka_batch.kafka.publish), against the real broker:
attempts SIGKILLed while producing and after the Kafka commit, a zombie attempt racing a newer one, and
a batch blocked by another's pending publish. Ground truth is the output topic read by a plain
read_committed consumer: every message of the batch exactly once, whatever the attempts did."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter

import pytest

from kafka_batch.errors import FencedAttempt, InputError, ServiceError
from kafka_batch.kafka.publish import Decision, Message, Published, Publisher, decide
from tests.integration.helpers import ROOT, _committed_messages, create_topic, kafka_config

pytestmark = pytest.mark.integration


def _attempt(spec: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.integration.publish_worker", json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _published(topic: str) -> Counter:
    """(batch, i) of every message a read_committed consumer sees, with how many times it sees each."""
    return Counter((v["batch"], v["i"]) for v in (json.loads(m.value()) for m in _committed_messages(topic, [0, 1])))


@pytest.fixture
def topics():
    name = f"publish_{uuid.uuid4().hex[:8]}"
    create_topic(f"{name}_in", 2)
    create_topic(f"{name}_out", 2)
    return name, f"{name}_in", f"{name}_out"


def test_crashes_at_every_point_publish_each_batch_exactly_once(services, topics):
    pipeline, source, output = topics
    base = {"pipeline": pipeline, "topic": output, "count": 400}
    batch_1 = {**base, "batch": 1, "ranges": [[source, 0, 0, 50], [source, 1, 0, 40]], "pending": {"1": "running"}}

    # Killed while producing: half its messages sit in an open transaction, never visible.
    killed = _attempt({**batch_1, "attempt": 1, "crash": "producing"})
    assert killed.returncode == -9, killed.stderr
    # The next attempt fences it (its open transaction is aborted), finds nothing of it, publishes.
    # Killed right after the Kafka commit: before Postgres could commit.
    killed = _attempt({**batch_1, "attempt": 2, "crash": "committed"})
    assert killed.returncode == -9, killed.stderr
    # The third attempt finds the batch's identity committed with its messages: Postgres only.
    third = _attempt({**batch_1, "attempt": 3})
    assert third.returncode == 0 and third.stdout.strip() == "complete", third.stderr
    # Batch 2 publishes once batch 1 is committed to Postgres (no longer pending).
    second = _attempt({**base, "batch": 2, "attempt": 1, "ranges": [[source, 0, 50, 90]]})
    assert second.stdout.strip() == "publish", second.stderr

    seen = _published(output)
    assert set(seen) == {(b, i) for b in (1, 2) for i in range(400)}
    assert set(seen.values()) == {1}, [k for k, n in seen.items() if n > 1][:5]


def test_a_zombie_attempt_is_fenced_and_publishes_nothing(services, topics):
    pipeline, source, output = topics
    zombie = Publisher(kafka_config(), pipeline, output, timeout=30)
    zombie.fence()
    newer = Publisher(kafka_config(), pipeline, output, timeout=30)

    def zombie_messages():
        for i in range(100):
            if i == 50:
                # The newer attempt starts while the zombie is producing, and publishes the batch.
                newer.fence()
                assert decide(7, newer.published([(source, 0)]), {7: "running"}) is Decision.PUBLISH
                newer.publish((Message(None, json.dumps({"batch": 7, "i": i}).encode()) for i in range(100)),
                              Published(7, 2, "batch"))
            yield Message(None, json.dumps({"batch": 7, "i": 1000 + i}).encode())

    with pytest.raises(FencedAttempt, match="attempt 1 was fenced"):
        zombie.publish(zombie_messages(), Published(7, 1, "batch"))
    assert _published(output) == Counter({(7, i): 1 for i in range(100)})
    assert [(p.batch_id, p.attempt) for p in newer.published([(source, 0)])] == [(7, 2)]
    zombie.close()
    newer.close()


def test_a_batch_waits_for_another_batchs_pending_publish(services, topics):
    pipeline, source, output = topics
    first = Publisher(kafka_config(), pipeline, output, timeout=30)
    first.fence()
    first.publish([Message(None, b'{"batch": 3, "i": 0}')], Published(3, 1, "batch"))
    first.close()
    # A replay planned meanwhile: batch 3 is in Kafka and not in Postgres, so the replay must wait.
    replay = Publisher(kafka_config(), pipeline, output, timeout=30)
    replay.fence()
    found = replay.published([(source, 0), (source, 1)])
    with pytest.raises(ServiceError, match="batch 3 is published to Kafka and not yet committed to Postgres"):
        decide(4, found, {3: "running", 4: "running"})
    assert decide(4, found, {4: "running"}) is Decision.PUBLISH  # once batch 3 committed
    replay.close()


def test_a_missing_output_topic_is_one_line_before_anything_is_produced(services, topics):
    pipeline, source, _ = topics
    publisher = Publisher(kafka_config(), pipeline, f"{pipeline}_missing", timeout=30)
    with pytest.raises(InputError, match=f"topic '{pipeline}_missing' does not exist"):
        publisher.fence()
    publisher.close()
