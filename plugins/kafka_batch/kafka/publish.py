"""Publishing a batch's output to a Kafka topic exactly once: one Kafka transaction per batch, under a
`transactional.id` stable per pipeline and topic, that also commits the batch's identity.

The identity is committed with `send_offsets_to_transaction` (Kafka's own consume-transform-produce
mechanism, KIP-98/KIP-447): the batch id as the offset of the output topic's first partition in the
*publish group* (named like the transactional id), with the batch id, attempt and kind as the offset's
metadata. A partition of the output topic, because the broker accepts offsets only for partitions it
has, and the output cluster need not hold the input topics. The group's offsets change only when a
transaction commits, so after `init_transactions` (which fences every older producer of the id and ends
what it left open) they say which batch's output the id committed last. `decide` turns that, and which
batches Postgres still has in flight, into what an attempt does; docs/design.md ("Publishing to Kafka")
has the argument.

Every call that waits on a broker runs under `bounded` (its timeout and a grace): librdkafka may outlast
its own timeout when a coordinator's node dies, and the attempt must end all the same.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kafka_batch.errors import FencedAttempt, InputError, ServiceError
from kafka_batch.kafka.bounded import GRACE_SECONDS, Stuck, bounded
from kafka_batch.kafka.source import LIBRDKAFKA_LOG, KafkaOffsets, admin_config, first_timestamps, refused

log = logging.getLogger("kafka_batch.kafka.publish")


IDENTITY_PARTITION = 0  # the output topic's partition under which the publish group keeps the last identity
# What publishing a batch asks of the output topic (AclOperation names; kafka.acls lists the rest).
PUBLISH_OPERATIONS = ("WRITE", "DESCRIBE_CONFIGS")


def transactional_id(pipeline: str, topic: str) -> str:
    """Stable per pipeline and output topic: every attempt of every batch shares it, so the newest
    attempt's `init_transactions` fences all the others."""
    return f"kafka-batch.{pipeline}.{topic}"


@dataclass(frozen=True)
class Published:
    """What the publish group says of a batch whose transaction committed."""

    batch_id: int
    attempt: int
    kind: str

    def metadata(self) -> str:
        return json.dumps({"batch": self.batch_id, "attempt": self.attempt, "kind": self.kind}, separators=(",", ":"))

    @classmethod
    def from_metadata(cls, text: str | None) -> Published | None:
        """The identity in an offset's metadata; None for an offset committed by someone else."""
        try:
            data = json.loads(text or "")
            return cls(int(data["batch"]), int(data["attempt"]), str(data["kind"]))
        except (ValueError, KeyError, TypeError):
            return None


class Decision(enum.Enum):
    PUBLISH = "publish"    # nothing of this batch is in the topic: produce it, in one transaction
    COMPLETE = "complete"  # an earlier attempt's transaction committed it: only the Postgres side is left


def decide(batch_id: int, found: Iterable[Published], pending: Mapping[int, str]) -> Decision:
    """What an attempt of `batch_id` does, once its `init_transactions` has fenced every older producer.

    `found`: the identities the publish group holds (the last batch the id published); `pending`: the
    batches Postgres has not committed, by id, with their status. A batch found in Kafka but not committed
    in Postgres blocks every other batch: publishing over it would replace its identity, and its next
    attempt would publish it again.
    """
    found = list(found)
    if any(p.batch_id == batch_id for p in found):
        return Decision.COMPLETE
    blocking = sorted({p.batch_id for p in found if p.batch_id in pending})
    if blocking:
        raise ServiceError(
            f"batch {batch_id}: batch {blocking[0]} is published to Kafka and not yet committed to Postgres"
            f" ({pending[blocking[0]]}); its next attempt completes it (its DAG run's retry, or kafka-batch run"
            " --run-id), then this batch can publish"
        )
    return Decision.PUBLISH


class Message(NamedTuple):
    """One message to produce. Any (key, value, headers) tuple serves: a batch makes millions of them."""

    key: bytes | str | None
    value: bytes | str | None
    headers: list[tuple[str, bytes | str]] | None = None


# The sink's producer writes with these whatever the connection's extra says: a message counts as written once
# every in-sync replica has it (a leader that dies before its followers copied it loses nothing acknowledged),
# and a retried send never writes it twice (tests/integration/test_failover.py shows both).
DURABLE = {"enable.idempotence": True, "acks": "all"}


class Publisher:
    """One attempt's transactional producer for a pipeline's output topic."""

    def __init__(self, config: dict[str, Any], pipeline: str, topic: str, *, timeout: float = 60.0,
                 transaction_timeout_ms: int = 900_000, message_max_bytes: int = 1_000_000):
        self.topic = topic
        self.transactional_id = transactional_id(pipeline, topic)
        self._config = admin_config(config)
        self._timeout = timeout
        self._producer = Producer({
            **self._config, "transactional.id": self.transactional_id, **DURABLE,
            "transaction.timeout.ms": transaction_timeout_ms, "linger.ms": 5, "logger": LIBRDKAFKA_LOG,
            "message.max.bytes": max(message_max_bytes, 1_000_000),
        })
        self._group = _publish_group(self._config, self.transactional_id)
        self._topic = KafkaOffsets(self._config, timeout)  # the output topic's metadata: fence, check_writable
        self._open = False  # a transaction begun and neither committed nor aborted
        self._stuck = False  # a call outlasted its bound: the handles are given up, never called again

    def _bounded(self, call, what: str):
        """`call()` on the producer or the group, within the client's timeout and a grace (kafka.bounded)."""
        if self._stuck:
            raise Stuck(f"{self.transactional_id}: an earlier call did not return; this producer is given up")
        try:
            return bounded(call, self._timeout + GRACE_SECONDS, f"{what} of {self.transactional_id}")
        except Stuck:
            self._stuck, self._open = True, False
            raise

    def fence(self) -> None:
        """Become the id's only producer: older ones (zombie attempts, other batches) are fenced and the
        transaction they left open is aborted, or completed if it was committing. A missing output topic
        is refused first, in one line (a producer would wait for it until its messages time out)."""
        self._topic.partitions((self.topic,))
        try:
            self._bounded(lambda: self._producer.init_transactions(self._timeout), "init_transactions")
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise InputError(f"the broker refused transaction.timeout.ms of {self.transactional_id}:"
                                 f" {exc.args[0].str()}; set sinks.kafka.transaction_timeout_seconds at most to"
                                 " the broker's transaction.max.timeout.ms") from None
            denied = refused(exc.args[0], f"Write on the transactional id {self.transactional_id!r}")
            if denied:
                raise denied from None
            # The coordinator may be unable to end the id's last transaction: its markers need the topic's
            # in-sync replicas too (CONCURRENT_TRANSACTIONS until they are back).
            raise _service_error(f"could not start the transactional producer {self.transactional_id}", exc,
                                 self._why()) from None

    def check_writable(self) -> None:
        """Before a batch publishes, before anything is read or produced: a topic the user may not write is
        refused in one line (exit 2); one that cannot take acks=all writes now (too few in-sync replicas)
        is a retried error naming it."""
        self._topic.refuse_unauthorized([self.topic], PUBLISH_OPERATIONS, "to publish the batch")
        short = self._topic.short_of_replicas(self.topic)
        if short:
            raise ServiceError(f"cannot publish to {self.topic!r} now: {short}; nothing was published")

    def published(self, inputs: Iterable[tuple[str, int]] = ()) -> list[Published]:
        """The identities the publish group holds (after `fence`: final); `inputs`, the batch's input
        partitions, for identities releases before 0.2 committed under them."""
        return self._bounded(lambda: _identities(self._group, self.transactional_id, self.topic, inputs, self._timeout),
                             "reading the publish group")

    def publish(self, messages: Iterable[Message], identity: Published) -> int:
        """Produce the messages and commit them with the batch's identity, in one transaction; returns how
        many were produced. A newer attempt fences this one: FencedAttempt, nothing of it is visible."""
        produced = self.produce(messages, identity)
        self.commit(identity)
        return produced

    def produce(self, messages: Iterable[Message], identity: Published) -> int:
        """Produce messages in the attempt's transaction (begun by the first call): nobody reading
        `read_committed` sees them before `commit`, nor ever if the attempt ends without it."""
        produced = 0
        produce, topic = self._producer.produce, self.topic  # bound once: a batch produces millions
        with self._failing(identity):
            self._begin()
            for key, value, headers in messages:
                try:
                    produce(topic, value, key, headers=headers)
                except BufferError:  # the local queue is full: let librdkafka send some first
                    self._produce_when_queued(topic, key, value, headers)
                produced += 1
        return produced

    def commit(self, identity: Published) -> None:
        """Commit what the transaction holds, with the batch's identity in the publish group."""
        with self._failing(identity):
            self._begin()
            offsets = [TopicPartition(self.topic, IDENTITY_PARTITION, identity.batch_id, metadata=identity.metadata())]
            group = self._group.consumer_group_metadata()
            self._bounded(lambda: self._producer.send_offsets_to_transaction(offsets, group, self._timeout),
                          "send_offsets_to_transaction")
            self._bounded(lambda: self._producer.commit_transaction(self._timeout), "commit_transaction")
            self._open = False

    def _begin(self) -> None:
        if not self._open:
            self._producer.begin_transaction()
            self._open = True

    @contextlib.contextmanager
    def _failing(self, identity: Published) -> Iterator[None]:
        """The broker's refusals as the project's errors, the transaction aborted where it can be."""
        try:
            yield
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                self._open = False  # the fence ended it: nothing to abort
                raise FencedAttempt(f"batch {identity.batch_id}: attempt {identity.attempt} was fenced by a newer"
                                    f" producer of {self.transactional_id}; it published nothing") from None
            if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                raise InputError(f"output topic {self.topic!r} does not exist; nothing was published") from None
            if error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
                self.abort()
                raise InputError(f"topic {self.topic!r} refused a message as too large ({error.str()}); set"
                                 " sinks.kafka.max_message_bytes at most to the topic's max.message.bytes (larger"
                                 " records are then quarantined); nothing was published") from None
            denied = refused(error, f"publishing to {self.topic!r} as {self.transactional_id}; nothing was published")
            if denied:
                raise denied from None
            self.abort()
            raise _service_error(f"publishing batch {identity.batch_id} to {self.topic!r}", exc, self._why()) from None

    def _why(self) -> str:
        """What may keep the topic from taking the transaction's messages (too few in-sync replicas), for a
        failed publish's error; nothing where the cluster does not say."""
        try:
            return KafkaOffsets(self._config, min(self._timeout, 10.0)).short_of_replicas(self.topic) or ""
        except (KafkaException, ServiceError, InputError):
            return ""

    def _produce_when_queued(self, topic: str, key, value, headers) -> None:
        """Wait for room in the local queue, as long as the client's timeout: a queue that does not drain
        for that long is a cluster that does not take the messages."""
        deadline = time.monotonic() + self._timeout
        while True:
            self._producer.poll(0.05)
            try:
                self._producer.produce(topic, value, key, headers=headers)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    self.abort()
                    raise ServiceError(f"{self.transactional_id}: the producer's queue did not drain within"
                                       f" {self._timeout:g} s: the brokers of {topic!r} do not take its messages;"
                                       " nothing of the transaction is visible") from None

    def abort(self) -> None:
        """End an open transaction unpublished, where the broker still lets this producer."""
        if not self._open:
            return
        self._open = False
        try:
            self._bounded(lambda: self._producer.abort_transaction(self._timeout), "abort_transaction")
        except (KafkaException, Stuck):
            pass  # fenced, fatal or stuck: the next attempt's init_transactions ends it

    def close(self) -> None:
        """Abort what was not committed, and let go of the producer and the publish group, each within its
        bound (closing a handle has no timeout of its own). Given up after a stuck call: nothing is called."""
        self.abort()
        if self._stuck:
            return
        for handle, what in ((self._producer, "closing the producer"), (self._group, "closing the publish group")):
            try:
                self._bounded(lambda handle=handle: _warnings_logged(handle.close), what)
            except (KafkaException, RuntimeError, Stuck):
                pass  # closed already, or given up: the broker forgets the client by itself


def _warnings_logged(call):
    """`call()`, the warnings it gives logged instead of printed: confluent-kafka warns on standard error
    when closing a producer whose transaction it could not abort (the next attempt's init_transactions
    ends it), and a command's error stays one line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    for warning in caught:
        log.warning("%s", warning.message)
    return result


def refuse_unpublishable(config: dict[str, Any], pipeline, timeout: float = 30.0) -> None:
    """Before a batch is planned: an output topic the connection's user may not publish to is refused in one
    line (exit 2), so nothing is planned that could not commit."""
    topics = [sink.topic for sink in pipeline.publishing_sinks]
    if topics:
        KafkaOffsets(config, timeout).refuse_unauthorized(topics, PUBLISH_OPERATIONS, "to publish the pipeline's batches")


def published_pending(config: dict[str, Any], pipeline, pending: Mapping[int, str],
                      inputs: Iterable[tuple[str, int]]) -> dict[int, str]:
    """Which of the batches that may still commit (`pending`) are in Kafka already, per batch the topic:
    their output is published and their Postgres commit is pending. Every producer of each output topic is
    fenced first, so no other batch can become so meanwhile. What would supersede such a batch must not:
    a position reset refuses, planning hands the batch to the run (its next attempt completes it; a new
    batch would publish again)."""
    found: dict[int, str] = {}
    inputs = list(inputs)
    for sink in pipeline.publishing_sinks:
        publisher = Publisher(config, pipeline.name, sink.topic, timeout=sink.call_timeout_seconds)
        try:
            publisher.fence()
            found.update({p.batch_id: sink.topic for p in publisher.published(inputs) if p.batch_id in pending})
        finally:
            publisher.close()
    return found


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction holding an output partition's last stable offset back: `read_committed` readers
    of the topic wait at `stable` until it ends."""

    partition: int
    stable: int
    end: int
    since: datetime | None  # its first record's time


def sink_states(config: dict[str, Any], pipeline, inputs: Iterable[tuple[str, int]],
                timeout: float = 10.0) -> list[dict[str, Any]]:
    """What an operator wants to know of each Kafka sink of the pipeline: the last batch committed on its
    topic (from the publish group) and any open transaction on it, with its age."""
    return [_sink_state(config, pipeline.name, sink.topic, list(inputs), timeout) for sink in pipeline.publishing_sinks]


def _sink_state(config: dict[str, Any], pipeline: str, topic: str, inputs: list[tuple[str, int]],
                timeout: float) -> dict[str, Any]:
    offsets = KafkaOffsets(config, timeout)
    partitions = offsets.partitions((topic,))
    stable, ends = offsets.offsets(partitions), offsets.ends(partitions)
    held = {tp: (stable[tp].last_stable, ends[tp]) for tp in partitions if stable[tp].last_stable < ends[tp]}
    since = first_timestamps(config, {tp: lso for tp, (lso, _) in held.items()}, timeout, committed=False)
    group = _publish_group(admin_config(config), transactional_id(pipeline, topic))
    what = f"the publish group {transactional_id(pipeline, topic)}"
    try:
        found = bounded(lambda: _identities(group, transactional_id(pipeline, topic), topic, inputs, timeout),
                        timeout + GRACE_SECONDS, f"reading {what}")
    finally:
        with contextlib.suppress(KafkaException, RuntimeError, Stuck):
            bounded(group.close, timeout + GRACE_SECONDS, f"closing {what}")
    last = max(found, key=lambda p: p.batch_id, default=None)
    return {"topic": topic, "transactional_id": transactional_id(pipeline, topic),
            "last_published": None if last is None else asdict(last),
            "open_transactions": [asdict(OpenTransaction(
                p, lso, end, None if since.get((t, p)) is None else datetime.fromtimestamp(since[(t, p)] / 1000, UTC)))
                for (t, p), (lso, end) in sorted(held.items())]}


def _publish_group(config: dict[str, Any], group_id: str) -> Consumer:
    """A client of the publish group (named like the transactional id); it never consumes."""
    return Consumer({**config, "group.id": group_id, "enable.auto.commit": False, "logger": LIBRDKAFKA_LOG})


# A group's coordinator moved or is still reading its log: asked again, the next answer may be the one.
COORDINATOR_MOVED = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                     KafkaError.COORDINATOR_NOT_AVAILABLE)


def _identities(group: Consumer, group_id: str, topic: str, inputs: Iterable[tuple[str, int]],
                timeout: float) -> list[Published]:
    """The batch identities the publish group's offsets carry: under the output topic's first partition,
    and under the input partitions, where releases before 0.2 committed them (a batch such a release
    published and Postgres has not committed yet must still be found)."""
    keys = [TopicPartition(topic, IDENTITY_PARTITION), *(TopicPartition(t, p) for t, p in inputs)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            committed = group.committed(keys, timeout=max(1.0, deadline - time.monotonic()))
            break
        except KafkaException as exc:
            # The group's coordinator moved (a node died, a leader was elected): ask again, as Kafka's own
            # clients do, until the timeout.
            denied = refused(exc.args[0], f"Describe on the publish group {group_id!r}")
            if denied:
                raise denied from None
            if exc.args[0].code() not in COORDINATOR_MOVED or time.monotonic() >= deadline:
                raise _service_error(f"could not read the publish group {group_id}", exc) from None
            time.sleep(0.5)
    return [found for tp in committed if (found := Published.from_metadata(tp.metadata)) is not None]


def _service_error(what: str, exc: KafkaException, why: str = "") -> ServiceError:
    """The broker did not do it: a new attempt (a new producer) may. An abortable error (the coordinator
    aborted or lost the transaction) says that nothing of it is visible; `why`, what the cluster says
    may have caused it."""
    error = exc.args[0]
    aborted = "; nothing of the transaction is visible, a new attempt publishes the batch" if (
        error.txn_requires_abort()) else ""
    return ServiceError(f"{what}: {error.str()}{aborted}" + (f" ({why})" if why else ""))
