"""The local broker's front against noida-db itself: read_committed reads from any offset return exactly
the committed records, however producers abort and commit; noida-db alone does not (the reason the
front exists). The expectation is what the producers know they committed (their delivery reports)."""

from __future__ import annotations

import json
import random
import shutil
import socket
import struct
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kio.schema.fetch.v12.response import FetchResponse
from kio.serial import entity_reader

from kafka_batch_dev import local_stack
from kafka_batch_dev.kafka_front import fetch_request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker():
    """noida-db and its front, started as `kafka-batch local up` starts them: (state, base)."""
    base = Path(tempfile.mkdtemp(prefix="kafka_batch_front_"))
    state: dict = {}
    local_stack.start_kafka(base, state)
    try:
        yield state, base
    finally:
        local_stack.stop_kafka(state)
        shutil.rmtree(base, ignore_errors=True)


def address(state: dict, key: str) -> str:
    return f"127.0.0.1:{state[f'{key}_port']}"


class Producers:
    """Two transactional producers that each commit and abort (as exactly-once producers do) and one
    plain producer, interleaved; `committed` is what their delivery reports say was committed."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, seed: int):
        self.topic, self.partitions, self.rng = topic, partitions, random.Random(seed)
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the result: its handle serves it
        admin.create_topics([NewTopic(topic, partitions)])[topic].result()
        self.transactional = [Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-{i}",
                                        "linger.ms": 1}) for i in range(2)]
        self.plain = Producer({"bootstrap.servers": bootstrap})
        for producer in self.transactional:
            producer.init_transactions(30)
        self.committed: dict[tuple[int, int], bytes] = {}
        self.open: dict[int, dict] = {}

    def _send(self, producer: Producer, into: dict, count: int) -> None:
        def delivered(error, message):
            assert error is None, error
            into[(message.partition(), message.offset())] = message.value()

        for _ in range(count):
            producer.produce(self.topic, value=uuid.uuid4().bytes, partition=self.rng.randrange(self.partitions),
                             on_delivery=delivered)
        producer.flush(30)

    def step(self) -> None:
        which = self.rng.randrange(3)
        if which == 2:
            self._send(self.plain, self.committed, self.rng.randint(1, 4))
            return
        producer = self.transactional[which]
        if which not in self.open:
            producer.begin_transaction()
            self.open[which] = {}
        self._send(producer, self.open[which], self.rng.randint(1, 6))
        if self.rng.random() < 0.5:
            self.end(which, commit=self.rng.random() < 0.6)

    def end(self, which: int, commit: bool) -> None:
        records = self.open.pop(which)
        if commit:
            self.transactional[which].commit_transaction(30)
            self.committed.update(records)
        else:
            self.transactional[which].abort_transaction(30)


# Answers of a few batches each (the front keeps the rest for the next fetches), or the whole partition.
FETCH_BYTES = (300, 1_048_576)


def read(bootstrap: str, topic: str, partition: int, start: int, fetch_bytes: int) -> dict[tuple[int, int], bytes]:
    """Every record a read_committed consumer sees from `start` to the partition's end, fetching at most
    `fetch_bytes` at a time."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "front-test", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                         "max.partition.fetch.bytes": fetch_bytes})
    consumer.assign([TopicPartition(topic, partition, start)])
    found = {}
    try:
        while True:
            message = consumer.poll(10)
            assert message is not None, f"{topic}[{partition}] from {start}: no end of partition within 10 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return found
            found[(partition, message.offset())] = message.value()
    finally:
        consumer.close()


def mismatches(bootstrap: str, producers: Producers, starts_per_partition: int) -> list[tuple[int, int]]:
    """(partition, start, fetch bytes) of the reads from `bootstrap` that differ from the committed records, the
    starts taken in random order (so the front often meets a partition first in the middle)."""
    wrong = []
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = [TopicPartition(producers.topic, p) for p in range(producers.partitions)]
    ends = [admin.list_offsets({tp: spec for tp in partitions}, isolation_level=IsolationLevel.READ_COMMITTED)
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest())]  # reads end at an open transaction
    for partition, tp in enumerate(partitions):
        start, end = (offsets[tp].result().offset for offsets in ends)
        starts = list(range(start, end + 1, max(1, (end - start) // starts_per_partition)))
        producers.rng.shuffle(starts)
        for start in starts:
            expected = {k: v for k, v in producers.committed.items() if k[0] == partition and start <= k[1] < end}
            wrong += [(partition, start, size) for size in FETCH_BYTES
                      if read(bootstrap, producers.topic, partition, start, size) != expected]
    return wrong


def test_reads_from_any_offset_return_the_committed_records_as_producers_abort_and_commit(broker):
    state, _ = broker
    producers = Producers(address(state, "kafka"), f"front_{uuid.uuid4().hex[:8]}", partitions=2, seed=5)
    for _ in range(60):
        producers.step()
    # A transaction still open: reads stop before it (the last stable offset), whatever its producer did before.
    assert producers.open or producers.step() or producers.open
    assert mismatches(address(state, "kafka"), producers, 20) == []
    for which in list(producers.open):
        producers.end(which, commit=True)
    for _ in range(30):
        producers.step()
    for which in list(producers.open):
        producers.end(which, commit=False)
    assert mismatches(address(state, "kafka"), producers, 20) == []
    # noida-db itself answers otherwise: without the front, these reads skip committed records.
    assert mismatches(address(state, "kafka_broker"), producers, 20)


def test_reads_stay_right_after_records_are_deleted_and_after_a_restart(broker):
    state, base = broker
    bootstrap = address(state, "kafka")
    producers = Producers(bootstrap, f"front_{uuid.uuid4().hex[:8]}", partitions=1, seed=8)
    producer = producers.transactional[0]
    for commit in (True, False, True, False, True):
        producer.begin_transaction()
        producers.open[0] = {}
        producers._send(producer, producers.open[0], 5)
        producers.end(0, commit)
    # Retention deletes the first transactions: the log now starts inside the first aborted one.
    first_aborted = min(o for _, o in producers.committed) + 6
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(producers.topic, 0, first_aborted + 2)]).values():
        future.result()
    producers.committed = {k: v for k, v in producers.committed.items() if k[1] >= first_aborted + 2}
    assert mismatches(bootstrap, producers, 10) == []
    # A restarted broker and front (the index of markers is rebuilt from the log).
    local_stack.stop_kafka(state)
    local_stack.start_kafka(base, state)
    for _ in range(20):
        producers.step()
    for which in list(producers.open):
        producers.end(which, commit=True)
    assert mismatches(address(state, "kafka"), producers, 15) == []


def fetch_requests(stats: list[dict]) -> int:
    """Fetch requests the consumer has sent to the broker, from its latest librdkafka statistics."""
    return sum(b["req"].get("Fetch", 0) for b in stats[-1]["brokers"].values() if b["nodeid"] >= 0)


def test_a_fetch_that_finds_nothing_is_held_as_kafka_holds_it_and_answered_when_records_come(broker):
    """Apache Kafka holds a fetch up to its max wait for records to arrive; noida-db answers at once,
    so a consumer at a partition's end asked again thousands of times a second."""
    state, _ = broker
    bootstrap = address(state, "kafka")
    topic = f"front_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"first")
    producer.flush(10)
    stats: list[dict] = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "front-test", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 400, "statistics.interval.ms": 100,
                         "stats_cb": lambda raw: stats.append(json.loads(raw))})
    try:
        consumer.assign([TopicPartition(topic, 0, 1)])  # at the end
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert consumer.poll(0.1) is None
        # 2 s at the end: about five held fetches (each 0.4 s), not one per round trip.
        assert 2 <= fetch_requests(stats) <= 10, fetch_requests(stats)
        # A fetch held for 5 s answers as soon as a record arrives.
        consumer.close()
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "front-test", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 5000})
        consumer.assign([TopicPartition(topic, 0, 1)])
        consumer.poll(1.0)  # its first fetch is now held
        producer.produce(topic, b"second")
        producer.flush(10)
        produced = time.monotonic()
        message = consumer.poll(10)
        assert message is not None and message.value() == b"second"
        assert time.monotonic() - produced < 1.5  # not at the end of the 5 s wait
    finally:
        consumer.close()


def fetch(bootstrap: str, topic: str, offset: int, partition_max_bytes: int) -> bytes:
    """The records of one Fetch (v12, read_committed) of partition 0 from `offset`, sent by hand."""
    request = fetch_request(topic, 0, offset, 1, partition_max_bytes, isolation_level=1, client_id="test")
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        stream = sock.makefile("rb")
        frame = stream.read(struct.unpack(">i", stream.read(4))[0])
    response, _ = entity_reader(FetchResponse)(frame, 5)  # correlation id, no tagged fields
    return response.responses[0].partitions[0].records or b""


def test_a_fetch_is_answered_with_the_bytes_it_asks_for_and_read_through_such_answers_a_partition_is_whole(broker):
    """noida-db answers a fetch with everything from its offset on, and a client holds that whole answer;
    Kafka answers with at most the bytes the fetch asks (whole batches, at least one), so a consumer's
    settings bound its memory. A partition read to its end beside one still being read stays answered."""
    state, _ = broker
    bootstrap = address(state, "kafka")
    topic = f"front_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2)])[topic].result()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16_384})
    for i in range(20_000):
        producer.produce(topic, key=str(i).encode(), value=bytes(1000), partition=0)  # 20 MB
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=b"small", partition=1)
    producer.flush(60)
    assert 0 < len(fetch(bootstrap, topic, 5000, 65_536)) <= 65_536 + 16_384 + 1024
    assert len(fetch(bootstrap, topic, 5000, 1)) > 0  # at least one batch
    assert len(fetch(bootstrap, topic, 0, 2**31 - 1)) > 20_000_000
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "front-test", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "max.partition.fetch.bytes": 65_536, "fetch.wait.max.ms": 10})
    try:
        consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
        keys: dict[int, list[bytes]] = {0: [], 1: []}
        ended: set[int] = set()
        while len(ended) < 2 and (message := consumer.poll(10)) is not None:
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
            else:
                keys[message.partition()].append(message.key())
        assert keys == {0: [str(i).encode() for i in range(20_000)], 1: [str(i).encode() for i in range(10)]}
    finally:
        consumer.close()


def test_a_transaction_open_across_a_restart_fails_as_abortable_and_leaves_no_record_or_offset_behind(broker):
    """noida-db aborts a transaction open at its restart, then acknowledged its commit (offsets applied
    to the group) and appended its producer's later records with no marker ever to end them, so every
    read_committed reader stopped below them for good. Through the front such a transaction fails as
    Apache Kafka fails one its coordinator aborted: abortable, so its producer aborts and begins again.
    The expectation: what the producers know they committed, and no offset of a failed commit."""
    state, base = broker
    topic, source = f"front_{uuid.uuid4().hex[:8]}", f"front_src_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": address(state, "kafka")})
    for name in (topic, source):
        admin.create_topics([NewTopic(name, 1)])[name].result()
    group = Consumer({"bootstrap.servers": address(state, "kafka"), "group.id": f"front-{topic}"})

    def producer(name: str) -> Producer:
        made = Producer({"bootstrap.servers": address(state, "kafka"), "transactional.id": f"{topic}-{name}"})
        made.init_transactions(30)
        return made

    # A zombie, open with records; one that sent its offsets too; then the broker restarts.
    zombie, committing = producer("a"), producer("b")
    for which in (zombie, committing):
        which.begin_transaction()
        for n in range(5):
            which.produce(topic, f"lost-{n}".encode())
        which.flush(30)
    committing.send_offsets_to_transaction([TopicPartition(source, 0, 5)], group.consumer_group_metadata(), 30)
    local_stack.stop_kafka(state)
    local_stack.start_kafka(base, state)

    successor = producer("a")  # the zombie's id taken over, as a retried attempt does
    successor.begin_transaction()
    successor.produce(topic, b"successor")
    successor.commit_transaction(30)
    for which in (zombie, committing):
        with pytest.raises(KafkaException) as lost:
            if which is zombie:  # records after the restart: never appended
                which.produce(topic, b"after the restart")
                which.flush(30)  # sent before its commit fails
                which.send_offsets_to_transaction([TopicPartition(source, 0, 7)], group.consumer_group_metadata(), 30)
            which.commit_transaction(30)
        assert lost.value.args[0].code() == KafkaError.UNKNOWN_PRODUCER_ID and lost.value.args[0].txn_requires_abort()
        which.abort_transaction(30)
    committing.begin_transaction()  # its producer begins again
    committing.produce(topic, b"again")
    committing.commit_transaction(30)

    found = read(address(state, "kafka"), topic, 0, 0, 1_048_576)  # to the partition's end: nothing left open
    assert [found[key] for key in sorted(found)] == [b"successor", b"again"]
    assert group.committed([TopicPartition(source, 0)], 30)[0].offset < 0  # no failed commit's offset
    group.close()
