"""All Kafka access: partition discovery and offsets for the planner, and the range reader.

Written for Apache Kafka semantics: offsets come from ListOffsets with READ_COMMITTED (the last
stable offset, so open transactions are never planned into a batch), and a range is read until the
consumer's position reaches `until`, never by counting records: transaction markers and compaction
leave offsets without records.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kafka_batch.core.ranges import OffsetRange
from kafka_batch.errors import DataLossError, InputError, ServiceError

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
    "group.id": "kafka-batch-range-reader",  # required by librdkafka; nothing is committed to Kafka
    "fetch.queue.backoff.ms": 0,
    "queued.min.messages": 200_000,
}
_ADMIN_KEYS_IGNORED = {"group.id", "isolation.level", "enable.auto.commit", "auto.offset.reset"}


@dataclass(frozen=True)
class PartitionOffsets:
    log_start: int
    last_stable: int


def _admin_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _ADMIN_KEYS_IGNORED and not k.startswith(("fetch.", "queued."))}


class KafkaOffsets:
    """What the planner asks Kafka: which partitions exist and which offsets are readable."""

    def __init__(self, config: dict[str, Any], timeout: float = 30.0):
        self._admin = AdminClient(_admin_config(config))
        self._timeout = timeout

    def partitions(self, topics: tuple[str, ...], pattern: str | None = None) -> list[tuple[str, int]]:
        """The partitions of the named topics, or of every topic whose whole name matches `pattern`."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise ServiceError(f"Kafka did not answer a metadata request within {self._timeout:.0f}s: "
                              f"{exc.args[0].str() if exc.args else exc}") from None
        if pattern is not None:
            topics = tuple(sorted(t for t in metadata.topics if re.fullmatch(pattern, t) and not t.startswith("__")))
            if not topics:
                raise InputError(f"no topic matches the pattern {pattern!r} (known topics: {len(metadata.topics)})")
        found = []
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None:
                raise InputError(f"topic {topic!r} does not exist (known topics: {len(metadata.topics)})")
            if meta.error is not None:
                raise ServiceError(f"topic {topic!r}: {meta.error}")
            found.extend((topic, p) for p in sorted(meta.partitions))
        return found

    def offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], PartitionOffsets]:
        if not partitions:
            return {}
        earliest = self._list(partitions, OffsetSpec.earliest())
        stable = self._list(partitions, OffsetSpec.latest())
        return {tp: PartitionOffsets(earliest[tp], stable[tp]) for tp in partitions}

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

    def _list(self, partitions: list[tuple[str, int]], spec: OffsetSpec) -> dict[tuple[str, int], int]:
        request = {TopicPartition(t, p): spec for t, p in partitions}
        futures = self._admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self._timeout
        )
        result = {}
        for tp, future in futures.items():
            try:
                result[(tp.topic, tp.partition)] = future.result().offset
            except KafkaException as exc:
                raise ServiceError(f"listing offsets of {tp.topic}[{tp.partition}] failed: {exc}") from exc
        return result


def reader_config(config: dict[str, Any]) -> dict[str, Any]:
    return {**_READER_DEFAULTS, **config, **_READER_REQUIRED}


def read_range(
    config: dict[str, Any],
    offset_range: OffsetRange,
    batch_size: int = 10_000,
    poll_timeout: float = 1.0,
    stall_timeout: float = 120.0,
) -> Iterator[list[Any]]:
    """Yield the visible records of [from, until) in batches of confluent_kafka Messages.

    Done when the position reaches `until`, when a record at or past `until` arrives, or when the
    end of the partition is at or past `until`. Aborted records and markers take offsets and are
    skipped by the client, so a range may yield nothing at all and still be complete.
    """
    r = offset_range
    consumer = Consumer(reader_config(config))
    tp = TopicPartition(r.topic, r.partition, r.from_offset)
    try:
        consumer.assign([tp])
        reached = r.from_offset  # the highest offset known to be consumed past
        last_progress = time.monotonic()
        while reached < r.until_offset:
            messages = consumer.consume(num_messages=batch_size, timeout=poll_timeout)
            batch = []
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        reached = max(reached, message.offset())
                        continue
                    _raise_read_error(r, reached, error)
                offset = message.offset()
                if offset >= r.until_offset:
                    reached = r.until_offset
                    break
                batch.append(message)
                reached = offset + 1
            if batch:
                yield batch
            position = consumer.position([TopicPartition(r.topic, r.partition)])[0].offset
            if position >= 0:
                reached = max(reached, min(position, r.until_offset))
            if messages:
                last_progress = time.monotonic()
            elif reached < r.until_offset and time.monotonic() - last_progress > stall_timeout:
                raise ServiceError(
                    f"{r.topic}[{r.partition}]: no progress for {stall_timeout:.0f}s at offset {reached}, "
                    f"expected to read up to {r.until_offset} (range {r.from_offset}..{r.until_offset}); "
                    "is the broker reachable and the range below the last stable offset?"
                )
    finally:
        consumer.close()


def _raise_read_error(r: OffsetRange, reached: int, error: KafkaError) -> None:
    where = f"{r.topic}[{r.partition}] range {r.from_offset}..{r.until_offset} at offset {reached}"
    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise DataLossError(f"{where}: offset out of range, records were deleted before they were read ({error.str()})")
    raise ServiceError(f"{where}: {error.str()}")


def first_timestamps(config: dict[str, Any], positions: dict[tuple[str, int], int],
                     timeout: float = 5.0) -> dict[tuple[str, int], int | None]:
    """The timestamp (ms) of the first committed record at or after each position: the oldest unread one.

    None where the partition has no record there (markers only, the end, or a position retention
    overtook) or none arrived in time.
    Nothing is committed to Kafka; one consumer reads at most one fetch per partition.
    """
    if not positions:
        return {}
    found: dict[tuple[str, int], int | None] = dict.fromkeys(positions)
    consumer = Consumer(reader_config({**config, "fetch.max.bytes": 1_048_576, "max.partition.fetch.bytes": 65_536}))
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
