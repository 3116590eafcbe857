"""The transactional check of a Kafka cluster: are a read_committed reader's answers what the guarantee needs?

Reads rest on the broker: its last stable offset ends a plan before any open transaction, and a
`read_committed` read from any offset must return every committed record and no aborted one. A broker
can get this wrong and nothing in a batch would show it (a Kafka-protocol server that lists aborted
transactions that ended before the fetch makes librdkafka drop a producer's later committed records).
So each cluster is checked once, by producing a known layout with one transactional id, the way
exactly-once producers write, and reading it back with the pipeline's own reader:

    offsets  c c c | C | a a a | A | c c c | C | o o       (c committed, a aborted, o open; C/A markers)

`kafka-batch check-kafka` runs it against a pipeline's cluster, `kafka-batch local up` against the
embedded broker; the verdict is kept per cluster id (core.kafka_checks), and a batch does not read
from a cluster whose verdict says reads could be wrong. The check writes to a topic of its own
(`kafka_batch_check_<random>`), deleted at the end.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_batch.errors import InputError, ServiceError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.kafka.source import LIBRDKAFKA_LOG, KafkaOffsets, admin_config, read_range

RECORDS_PER_TRANSACTION = 3


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    text: str  # one line: what was seen
    reads: bool  # a failure means a batch could read wrong, so batches refuse to read the cluster

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.text}"


@dataclass(frozen=True)
class KafkaCheck:
    cluster_id: str
    bootstrap_servers: str
    findings: tuple[Finding, ...]

    @property
    def reads_safe(self) -> bool:
        return all(f.ok for f in self.findings if f.reads)

    def as_json(self) -> list[dict]:
        return [asdict(f) for f in self.findings]


class _Layout:
    """What the probe wrote: the values and offsets of each transaction."""

    def __init__(self):
        self.offsets: dict[bytes, int] = {}

    def delivered(self, error: KafkaError | None, message) -> None:
        if error is not None:
            raise KafkaException(error)
        self.offsets[message.value()] = message.offset()

    def of(self, prefix: str) -> list[int]:
        return sorted(o for v, o in self.offsets.items() if v.startswith(prefix.encode()))


def check_cluster(config: dict[str, Any], timeout: float = 30.0) -> KafkaCheck:
    """Produce the probe's layout to a new topic, read it back as batches do, and say what was wrong."""
    offsets = KafkaOffsets(config, timeout=timeout)
    cluster_id = offsets.cluster_id()
    admin = AdminClient({**admin_config(config), "logger": LIBRDKAFKA_LOG})
    suffix = uuid.uuid4().hex[:12]
    topic = f"kafka_batch_check_{suffix}"
    try:
        admin.create_topics([NewTopic(topic, 1)], request_timeout=timeout)[topic].result()
    except KafkaException as exc:
        raise ServiceError(f"the check could not create its topic {topic}: {exc.args[0].str()}") from None
    try:
        findings = _probe(config, offsets, topic, f"kafka-batch-check-{suffix}", timeout)
    finally:
        admin.delete_topics([topic], operation_timeout=timeout)
    return KafkaCheck(cluster_id, str(config.get("bootstrap.servers", "")), tuple(findings))


def _producer(config: dict[str, Any], transactional_id: str) -> Producer:
    return Producer({**admin_config(config), "transactional.id": transactional_id, "linger.ms": 0,
                     "logger": LIBRDKAFKA_LOG})


def _transaction(producer: Producer, topic: str, layout: _Layout, prefix: str, end: str | None, timeout: float) -> None:
    producer.begin_transaction()
    for i in range(RECORDS_PER_TRANSACTION if end else 2):
        producer.produce(topic, value=f"{prefix}{i}".encode(), partition=0, on_delivery=layout.delivered)
    if producer.flush(timeout):
        raise ServiceError(f"the check's records were not delivered within {timeout:.0f}s")
    if end == "commit":
        producer.commit_transaction(timeout)
    elif end == "abort":
        producer.abort_transaction(timeout)


def _probe(config: dict[str, Any], offsets: KafkaOffsets, topic: str, transactional_id: str,
           timeout: float) -> list[Finding]:
    layout = _Layout()
    producer = _producer(config, transactional_id)
    try:
        producer.init_transactions(timeout)
    except KafkaException as exc:
        raise InputError(f"the check's transactional producer was refused: {exc.args[0].str()}") from None
    for prefix, end in (("first-", "commit"), ("aborted-", "abort"), ("second-", "commit"), ("open-", None)):
        _transaction(producer, topic, layout, prefix, end, timeout)
    first, aborted, second, open_ = (layout.of(p) for p in ("first-", "aborted-", "second-", "open-"))
    committed = set(first + second)
    end = offsets.offsets([(topic, 0)])[(topic, 0)].last_stable

    def read(start: int) -> set[int]:
        r = OffsetRange(topic, 0, start, min(end, open_[0]))
        return {m.offset() for chunk in read_range(config, r, stall_timeout=timeout) for m in chunk}

    findings = [Finding(
        "last_stable_offset", end == open_[0],
        f"the last stable offset stops at an open transaction ({end}; its first record is at {open_[0]})"
        if end == open_[0] else f"the last stable offset is {end} while a transaction is open from {open_[0]}: "
        "a plan could take in records whose transaction is not decided", reads=True)]
    whole = read(0)
    findings.append(Finding(
        "read_from_start", whole == committed,
        f"a read_committed read from the log start returns the {len(committed)} committed records and no aborted one"
        if whole == committed else _wrong("a read_committed read from the log start", whole, committed, aborted),
        reads=True))
    after = read(second[0])  # past the abort marker: the read never meets it
    findings.append(Finding(
        "read_after_abort", after == set(second),
        "a read that starts after an aborted transaction returns the same producer's later committed records"
        if after == set(second) else _wrong("a read that starts after an aborted transaction of the same producer",
                                            after, set(second), aborted)
        + " (as when a broker lists aborted transactions that ended before the fetch offset)", reads=True))
    inside = read(aborted[1])
    findings.append(Finding(
        "read_inside_abort", inside == set(second),
        "a read that starts inside an aborted transaction returns only the committed records after it"
        if inside == set(second) else _wrong("a read that starts inside an aborted transaction", inside, set(second),
                                             aborted), reads=True))
    findings.append(_fencing(config, producer, transactional_id, timeout))
    return findings


def _wrong(what: str, got: set[int], committed: set[int], aborted: list[int]) -> str:
    missed, shown = len(committed - got), len(got & set(aborted))
    return f"{what} returned {len(got & committed)} of {len(committed)} committed records" + (
        f" and {shown} aborted one(s)" if shown else "") + (f": {missed} committed record(s) skipped" if missed else "")


def _fencing(config: dict[str, Any], first: Producer, transactional_id: str, timeout: float) -> Finding:
    """A second producer with the same transactional id fences the first, whose transaction is still
    open: what keeps a zombie writer out (informative for reads; it also ends the open transaction)."""
    second = _producer(config, transactional_id)
    second.init_transactions(timeout)
    try:
        first.commit_transaction(timeout)
    except KafkaException as exc:
        fenced = exc.args[0].fatal() or exc.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                                               KafkaError.INVALID_PRODUCER_EPOCH)
    else:
        fenced = False
    return Finding("fencing", fenced, "a second producer with the same transactional id fences the first"
                   if fenced else "a producer whose transactional id was taken over could still commit",
                   reads=False)
