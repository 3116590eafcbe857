"""All Kafka access: partition discovery and offsets for the planner, and the range reader.

Written for Apache Kafka semantics: offsets come from ListOffsets with READ_COMMITTED (the last
stable offset, so open transactions are never planned into a batch), and a range is read until the
consumer's position reaches `until`, never by counting records: transaction markers and compaction
leave offsets without records.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import itertools
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from kafka_batch.errors import DataLossError, InputError, MissingTopic, ServiceError
from kafka_batch.kafka.bounded import GRACE_SECONDS
from kafka_batch.kafka.ranges import OffsetRange

# librdkafka's own log lines (e.g. one per failed reconnect, many a second while a broker is down) go
# through Python logging: into the task log under Airflow; the CLI keeps them out of the terminal,
# where the one-line error already names the broker that did not answer.
LIBRDKAFKA_LOG = logging.getLogger("kafka_batch.librdkafka")
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())

# The readers' consumer group: librdkafka's consumer needs one, and looks its coordinator up (which takes
# Describe on the group where ACLs are enforced: kafka.acls); nothing is ever committed to it.
READER_GROUP = "kafka-batch-range-reader"
# Settings the reader relies on; a connection's extra cannot override them.
_READER_REQUIRED = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    # An offset below the log start (retention) must surface as an error, never as a silent reset.
    "auto.offset.reset": "error",
}
# Throughput defaults a connection's extra may override.
_READER_DEFAULTS = {
    "group.id": READER_GROUP,
    # With its queue full, the fetcher waits this long before it looks again: librdkafka's 1 s can
    # leave a fast reader waiting for records, 0 keeps a core busy looking (a 3M-record read took
    # 6.5-7.0 s of CPU with 0, 3.9-4.1 s with 10, in the same wall time).
    "fetch.queue.backoff.ms": 10,
    "queued.min.messages": 200_000,
    # A range that ends in markers or aborted records ends at the partition's end event, which comes
    # with the answer to a fetch at the end: the broker holds that fetch this long (librdkafka's 500 ms
    # would add up to half a second to such a batch).
    "fetch.wait.max.ms": 50,
    # A read of known ranges takes all it can: answers of 8 MB a partition, not librdkafka's 1 MB, take
    # an eighth of the round trips (a 3M-record batch: 6.0 s against 6.2-6.3 s on the local broker). The
    # queue's bounds (queued.*) still bound what a worker holds.
    "max.partition.fetch.bytes": 8 * 1024 * 1024,
}
# A topic asked for by name that is not there: unknown, or a name Kafka cannot have.
_NO_SUCH_TOPIC = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_EXCEPTION)
# A partition's leadership moving: a request answered so is asked again (Kafka calls them retriable).
_LEADER_MOVING = (KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION,
                  KafkaError.LEADER_NOT_AVAILABLE, KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE)
_ADMIN_KEYS_IGNORED = {"group.id", "isolation.level", "enable.auto.commit", "auto.offset.reset"}
_ACL_HINT = "`kafka-batch acls --pipeline <name>` prints those a pipeline needs"
_AUTHORIZATION_FAILED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                         KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)


def refused(error: KafkaError, what: str) -> InputError | None:
    """A broker's authorization refusal of `what` as the operator's error (exit 2, never retried: only a
    grant helps; kafka.acls says which); None for any other error."""
    if error.code() not in _AUTHORIZATION_FAILED:
        return None
    return InputError(f"Kafka refused {what}: {error.str()} (the connection's user lacks an ACL; {_ACL_HINT})")


@dataclass(frozen=True)
class PartitionOffsets:
    log_start: int
    last_stable: int
    # The partition's leader epoch at the last stable offset (None where the broker does not say): a
    # position stored with it can be checked against a later leader's log (`truncations`).
    epoch: int | None = None


def admin_config(config: dict[str, Any]) -> dict[str, Any]:
    """The connection's settings that an admin client or a producer takes (none of the consumer's)."""
    return {k: v for k, v in config.items() if k not in _ADMIN_KEYS_IGNORED and not k.startswith(("fetch.", "queued."))}


class KafkaOffsets:
    """What the planner asks Kafka: which partitions exist and which offsets are readable."""

    def __init__(self, config: dict[str, Any], timeout: float = 30.0):
        # A metadata request for one topic never creates it (an admin client is a producer to librdkafka,
        # which would ask the broker to create a missing topic: a typo'd name would become a topic).
        self._admin = AdminClient({**admin_config(config), "allow.auto.create.topics": False, "logger": LIBRDKAFKA_LOG,
                                   "error_cb": self._on_error})
        self._config = config
        self._timeout = timeout
        self._refused: str | None = None  # why the broker refused the connection's credentials

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            self._refused = error.str()

    def _unavailable(self, what: str, exc: KafkaException, asked: str = "a request") -> Exception:
        """Wrong credentials and a missing ACL (for what was `asked`) are the operator's to fix (never
        retried); anything else may pass."""
        self._admin.poll(0)  # serves the error callbacks librdkafka queued meanwhile
        if self._refused:
            return InputError(f"Kafka refused the credentials of the connection: {self._refused}")
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        return (error and refused(error, asked)) or ServiceError(f"{what}: {error.str() if error else exc}")

    def cluster_id(self) -> str:
        """The cluster's id, which the transactional check's verdict is kept under."""
        try:
            return self._answer(self._admin.describe_cluster(request_timeout=self._timeout), "describing the cluster"
                                ).cluster_id
        except KafkaException as exc:
            raise self._unavailable(f"Kafka did not describe its cluster within {self._timeout:.0f}s", exc,
                                    "describing the cluster") from None

    def _answer(self, future, what: str):
        """An admin request's answer, waited for within the request's timeout and a grace (kafka.bounded)."""
        try:
            return future.result(timeout=self._timeout + GRACE_SECONDS)
        except concurrent.futures.TimeoutError:
            raise ServiceError(f"Kafka did not answer {what} within {self._timeout + GRACE_SECONDS:g} s") from None

    def partitions(self, topics: tuple[str, ...], pattern: str | None = None) -> list[tuple[str, int]]:
        """The partitions of the named topics, or of every topic whose whole name matches `pattern`. Named
        topics are asked for alone: the metadata of a cluster's every topic costs the client a Python
        object per partition (0.2 s for 4,000 partitions, in every plan and status)."""
        if pattern is not None:
            metadata = self._metadata()
            topics = tuple(sorted(t for t in metadata.topics if re.fullmatch(pattern, t) and not t.startswith("__")))
            if not topics:
                raise InputError(f"no topic matches the pattern {pattern!r} (known topics: {len(metadata.topics)})")
            described = metadata.topics
        else:
            described = {}
            for topic in topics:
                described.update(self._metadata(topic).topics)
        found = []
        for topic in topics:
            meta = described.get(topic)
            if meta is None or (meta.error is not None and meta.error.code() in _NO_SUCH_TOPIC):
                raise MissingTopic(f"topic {topic!r} does not exist")
            if meta.error is not None:
                raise refused(meta.error, f"Describe on topic {topic!r}") or ServiceError(f"topic {topic!r}: {meta.error}")
            found.extend((topic, p) for p in sorted(meta.partitions))
        return found

    def short_of_replicas(self, topic: str) -> str | None:
        """Why Kafka would refuse an acks=all write to `topic` now, or None: partitions without a leader,
        or with fewer in-sync replicas than the topic's `min.insync.replicas`."""
        partitions = self._metadata(topic).topics[topic].partitions
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            configs = self._answer(self._admin.describe_configs([resource], request_timeout=self._timeout)[resource],
                                   f"describing topic {topic}")
        except KafkaException as exc:
            raise self._unavailable(f"describing topic {topic!r} failed", exc,
                                    f"DescribeConfigs on topic {topic!r}") from None
        needed = int(configs["min.insync.replicas"].value)
        leaderless = sorted(p for p, meta in partitions.items() if meta.leader < 0)
        short = sorted(p for p, meta in partitions.items() if len(meta.isrs) < needed)
        if not leaderless and not short:
            return None
        said = [f"partitions {leaderless} have no leader"] if leaderless else []
        said += [f"partitions {short} have {min(len(partitions[p].isrs) for p in short)} in-sync replica(s), fewer than"
                 f" its min.insync.replicas {needed}"] if short else []
        return (f"topic {topic!r}: {'; '.join(said)}: Kafka refuses acks=all writes until enough replicas are back"
                " in sync (a node is down?)")

    def refuse_unauthorized(self, topics: list[str], operations: tuple[str, ...], needed_for: str) -> None:
        """An InputError naming what the connection's user may not do of `operations` (AclOperation names) on
        `topics`, by the broker's own answer (the operations it authorizes), asked before anything is planned
        or published; nothing where the broker does not say."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AclOperation

        futures = self._admin.describe_topics(TopicCollection(list(topics)), include_authorized_operations=True,
                                              request_timeout=self._timeout)
        lacking = {}
        for topic, future in futures.items():
            try:
                allowed = self._answer(future, f"describing topic {topic}").authorized_operations
            except KafkaException as exc:
                if exc.args and exc.args[0].code() in _NO_SUCH_TOPIC:
                    raise MissingTopic(f"topic {topic!r} does not exist") from None
                raise self._unavailable(f"describing topic {topic!r} failed", exc, f"Describe on topic {topic!r}") from None
            if allowed is not None and AclOperation.ALL not in allowed:
                missing = [op for op in operations if AclOperation[op] not in allowed]
                if missing:
                    lacking[topic] = missing
        if lacking:
            said = "; ".join(f"{' and '.join(op.title().replace('_', '') for op in ops)} on topic {t!r}"
                             for t, ops in sorted(lacking.items()))
            raise InputError(f"Kafka's ACLs refuse the connection's user {said}, needed {needed_for} ({_ACL_HINT})")

    def _metadata(self, topic: str | None = None):
        try:
            return self._admin.list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            raise self._unavailable(f"Kafka did not answer a metadata request within {self._timeout:.0f}s", exc,
                                    "a metadata request") from None

    def offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], PartitionOffsets]:
        if not partitions:
            return {}
        earliest = self._list(partitions, OffsetSpec.earliest())
        stable = self._listed(partitions, OffsetSpec.latest())
        return {tp: PartitionOffsets(earliest[tp], stable[tp].offset, stable[tp].leader_epoch) for tp in partitions}

    def log_starts(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Where each partition's log begins now (retention and deletions move it): one listing, not `offsets`'
        two."""
        return self._list(partitions, OffsetSpec.earliest()) if partitions else {}

    def offsets_for_time(self, partitions: list[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int | None]:
        """First offset whose timestamp is >= timestamp_ms; None where no such record exists yet."""
        found = self._list(partitions, OffsetSpec.for_timestamp(timestamp_ms))
        return {tp: (None if offset < 0 else offset) for tp, offset in found.items()}

    def offsets_at_time(self, partitions: list[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int]:
        """Where records at or after a time begin: offsets-for-times, else the end; never past the LSO."""
        found = self.offsets_for_time(partitions, timestamp_ms)
        ends = self.offsets(partitions)
        return {
            tp: ends[tp].last_stable if found[tp] is None else min(found[tp], ends[tp].last_stable) for tp in partitions
        }

    def truncations(self, positions: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
        """Where each partition's log, as its leader has it now, stops holding what was committed below its
        position (`positions`: partition -> (position, the leader epoch at it when committed)); partitions
        whose log holds it all are left out. Kafka's own check (KIP-320): a consumer assigned at the
        position with its epoch asks the leader where that epoch ends in its log, and librdkafka reports
        a log that ends before the position (an unclean election truncated it) instead of reading on."""
        consumer = Consumer({**reader_config(self._config), "logger": LIBRDKAFKA_LOG})
        found: dict[tuple[str, int], int] = {}
        pending = set(positions)
        try:
            consumer.assign([TopicPartition(t, p, offset, leader_epoch=epoch)
                             for (t, p), (offset, epoch) in positions.items()])
            deadline = time.monotonic() + self._timeout
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=500, timeout=0.5):
                    tp = (message.topic(), message.partition())
                    if tp not in pending:
                        continue
                    error = message.error()
                    if error is not None and "truncation" in error.str():
                        # librdkafka's own words: "... broker end offset is 10 (offset leader epoch 0) ..."
                        said = re.search(r"end offset is (\d+)", error.str())
                        found[tp] = int(said.group(1)) if said else 0  # not said: everything is in doubt
                    elif error is not None and error.code() not in (KafkaError._PARTITION_EOF,
                                                                      KafkaError._AUTO_OFFSET_RESET):
                        continue  # a transient error: librdkafka retries, the answer comes later
                    pending.discard(tp)  # a record or the partition's end at the position: the log holds it
                    consumer.pause([TopicPartition(*tp)])
        finally:
            consumer.close()
        if pending:
            named = ", ".join(f"{t}[{p}]" for t, p in sorted(pending)[:5])
            raise ServiceError(f"Kafka did not say within {self._timeout:g} s whether the logs of {named} still hold"
                               " what was committed (their leaders moved since)")
        return found

    def ends(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermarks, open transactions' records included (never planned: see `offsets`)."""
        return self._list(partitions, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)

    def _list(self, partitions: list[tuple[str, int]], spec: OffsetSpec,
              isolation: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[tuple[str, int], int]:
        return {tp: info.offset for tp, info in self._listed(partitions, spec, isolation).items()}

    def _listed(self, partitions: list[tuple[str, int]], spec: OffsetSpec,
                isolation: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[tuple[str, int], Any]:
        """One answer (offset, leader epoch) per partition. A partition whose leader died is answered with no offset
        (OFFSET_INVALID), not an error, as long as the client's metadata names that leader (or, while the
        leadership moves, with a retriable error such as "Leader epoch is newer than broker epoch"): its topic's
        metadata is asked for (which refreshes them) and the partition again, until the cluster has elected
        another leader (seconds), within the timeout. Each request waits a quarter of it (at least 5 s):
        a dead leader is waited for until the request's timeout."""
        deadline = time.monotonic() + self._timeout
        result: dict[tuple[str, int], Any] = {}
        asking = list(partitions)
        while True:
            request = {TopicPartition(t, p): spec for t, p in asking}
            wait = max(1.0, min(deadline - time.monotonic(), max(5.0, self._timeout / 4)))
            futures = self._admin.list_offsets(request, isolation_level=isolation, request_timeout=wait)
            moving: dict[tuple[str, int], str] = {}  # a retriable answer: a leader moving (a newer epoch, ...)
            for tp, future in futures.items():
                try:
                    result[(tp.topic, tp.partition)] = self._answer(future, f"listing offsets of {tp.topic}[{tp.partition}]")
                except KafkaException as exc:
                    if exc.args and (exc.args[0].retriable() or exc.args[0].code() in _LEADER_MOVING):
                        moving[(tp.topic, tp.partition)] = exc.args[0].str()
                        continue
                    raise self._unavailable(f"listing offsets of {tp.topic}[{tp.partition}] failed", exc,
                                            f"Describe on topic {tp.topic!r}") from None
            asking = [tp for tp in asking if tp in moving or result[tp].offset == OFFSET_INVALID]
            if not asking:
                return result
            if time.monotonic() >= deadline:
                named = ", ".join(f"{t}[{p}]" for t, p in asking[:5]) + (" ..." if len(asking) > 5 else "")
                if moving:
                    raise ServiceError(f"listing offsets of {named} failed within {self._timeout:g} s:"
                                       f" {next(iter(moving.values()))}")
                raise ServiceError(f"Kafka gave no offset for {named} within {self._timeout:g} s: no leader (a node is"
                                   " down and no in-sync replica took over)")
            time.sleep(0.5)
            for topic in {t for t, _ in asking}:
                self._metadata(topic)


def reader_config(config: dict[str, Any]) -> dict[str, Any]:
    return {**_READER_DEFAULTS, **config, **_READER_REQUIRED}


def read_range(
    config: dict[str, Any],
    offset_range: OffsetRange,
    batch_size: int = 10_000,
    poll_timeout: float = 1.0,
    stall_timeout: float = 120.0,
) -> Iterator[list[Any]]:
    """Yield the visible records of [from, until) in batches of confluent_kafka Messages."""
    for _, messages in read_partitions(config, [offset_range], batch_size, poll_timeout, stall_timeout):
        yield messages


def read_partitions(
    config: dict[str, Any],
    ranges: list[OffsetRange],
    batch_size: int = 10_000,
    poll_timeout: float = 1.0,
    stall_timeout: float = 120.0,
) -> Iterator[tuple[OffsetRange, list[Any]]]:
    """Yield the visible records of several ranges (one per partition) with one consumer, as
    (range, confluent_kafka Messages of that range's partition, in offset order).

    A range is done when the position reaches `until`, when a record at or past `until` arrives, or
    when the end of the partition is at or past `until`; it is then unassigned. Aborted records and
    markers take offsets and are skipped by the client, so a range may yield nothing and still be
    complete. Each batch waits (up to `poll_timeout`) for one message or event only, then takes
    what is already queued, at most the offsets left: a call never waits for records that markers
    or compaction left out, so a range ends as soon as its last record or the partition's end is in.
    """
    where = [(r.topic, r.partition) for r in ranges]
    if len(set(where)) != len(where):
        raise ValueError(f"one range per partition in a read, got {sorted(where)}")
    pending = {(r.topic, r.partition): r for r in ranges if r.until_offset > r.from_offset}
    if not pending:
        return
    reached = {key: r.from_offset for key, r in pending.items()}  # the offset each is known to be read up to
    topics = {t for t, _ in pending}
    only = where[0] if len(where) == 1 else None  # the consumer's one partition, if it is assigned just one
    consumer = Consumer(reader_config(config))
    try:
        consumer.assign([TopicPartition(t, p, r.from_offset) for (t, p), r in pending.items()])
        last_progress = time.monotonic()
        while pending:
            left = sum(r.until_offset - reached[key] for key, r in pending.items())
            first = consumer.poll(poll_timeout)
            want = min(batch_size, left)
            messages = [] if first is None else [first, *consumer.consume(want - 1, timeout=0)] if want > 1 else [first]
            events = any(map(Message.error, messages))
            # A consumer assigned `only` one partition gets only its records: a call without events is
            # one chunk as it is (grouping by partition costs the read a tenth of its CPU).
            chunks = {only: messages} if only is not None and not events else _by_partition(messages, topics)
            for key, chunk in chunks.items():
                r = pending.get(key)
                if r is None:
                    continue  # a partition already complete
                if events and any(map(Message.error, chunk)):
                    chunk = _without_events(chunk, r, reached)
                if chunk and chunk[-1].offset() >= r.until_offset:
                    # The range ends in this chunk: in offset order, its records are a prefix.
                    chunk = chunk[:bisect.bisect_left(chunk, r.until_offset, key=Message.offset)]
                    reached[key] = r.until_offset
                if chunk:
                    reached[key] = max(reached[key], chunk[-1].offset() + 1)
                    yield r, chunk
            for tp in consumer.position([TopicPartition(t, p) for t, p in pending]):
                if tp.offset >= 0:
                    key = (tp.topic, tp.partition)
                    reached[key] = max(reached[key], min(tp.offset, pending[key].until_offset))
            done = [key for key, r in pending.items() if reached[key] >= r.until_offset]
            if done:
                consumer.incremental_unassign([TopicPartition(t, p) for t, p in done])
                for key in done:
                    del pending[key]
            if messages:
                last_progress = time.monotonic()
            elif pending and time.monotonic() - last_progress > stall_timeout:
                key, r = min(pending.items())
                raise ServiceError(
                    f"{r.topic}[{r.partition}]: no progress for {stall_timeout:.0f}s at offset {reached[key]}, "
                    f"expected to read up to {r.until_offset} (range {r.from_offset}..{r.until_offset}); "
                    "is the broker reachable and the range below the last stable offset?"
                )
    finally:
        consumer.close()


def _by_partition(messages: list[Any], topics: set[str]) -> dict[tuple[str, int], list[Any]]:
    """The messages of one consume call per (topic, partition), each list in offset order. They come in
    runs of one partition, a fetch's worth each: the runs are found in C (groupby) and sliced. With one
    topic only the partition numbers are compared (a (topic, partition) pair made for every record
    would cost as much as the rest)."""
    if len(topics) == 1:
        [topic] = topics
        runs = (((topic, partition), run) for partition, run in itertools.groupby(map(Message.partition, messages)))
    else:
        runs = itertools.groupby(zip(map(Message.topic, messages), map(Message.partition, messages), strict=True))
    chunks: dict[tuple[str, int], list[Any]] = {}
    start = 0
    for key, run in runs:
        end = start + len(list(run))
        if key in chunks:
            chunks[key].extend(messages[start:end])
        else:
            chunks[key] = messages[start:end]
        start = end
    return chunks


def _without_events(chunk: list[Any], r: OffsetRange, reached: dict) -> list[Any]:
    """The records of a chunk that also holds events: the end of the partition moves `reached`,
    an error fails the read."""
    key = (r.topic, r.partition)
    records = []
    for message in chunk:
        error = message.error()
        if error is None:
            records.append(message)
        elif error.code() == KafkaError._PARTITION_EOF:
            reached[key] = max(reached[key], min(message.offset(), r.until_offset))
        else:
            _raise_read_error(r, reached[key], error)
    return records


def _raise_read_error(r: OffsetRange, reached: int, error: KafkaError) -> None:
    where = f"{r.topic}[{r.partition}] range {r.from_offset}..{r.until_offset} at offset {reached}"
    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise DataLossError(f"{where}: offset out of range, records were deleted before they were read ({error.str()})")
    raise refused(error, f"reading {where}") or ServiceError(f"{where}: {error.str()}")


def first_timestamps(config: dict[str, Any], positions: dict[tuple[str, int], int],
                     timeout: float = 5.0, committed: bool = True) -> dict[tuple[str, int], int | None]:
    """The timestamp (ms) of the first committed record at or after each position: the oldest unread one
    (with `committed` false, of any record: an open transaction's first, at a last stable offset).

    None where the partition has no record there (markers only, the end, or a position retention
    overtook) or none arrived in time.
    Nothing is committed to Kafka; one consumer reads at most one fetch per partition.
    """
    if not positions:
        return {}
    found: dict[tuple[str, int], int | None] = dict.fromkeys(positions)
    # One record a partition is all it needs, so little a partition and much a fetch: 16 KB a partition in
    # fetches of 16 MB asks a thousand partitions in one or two fetches (0.3 s), where 64 KB in 1 MB took
    # 1.1 s. Less a partition is slower: a record batch bigger than that comes back partial, and the
    # client asks again with twice the size (1 KB: 3.9 s).
    settings = reader_config({**config, "fetch.max.bytes": 16_777_216, "max.partition.fetch.bytes": 16_384})
    consumer = Consumer({**settings, **({} if committed else {"isolation.level": "read_uncommitted"})})
    pending = set(positions)
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=min(1.0, max(0.05, deadline - time.monotonic()))):
                tp = (message.topic(), message.partition())
                if tp not in pending:
                    continue
                if message.error() is None:
                    found[tp] = message.timestamp()[1]
                # Else the end of the partition, or an offset below the log start (data loss): no timestamp.
                pending.discard(tp)
                consumer.pause([TopicPartition(*tp)])
    finally:
        consumer.close()
    return found
