"""The Kafka sink: a batch's output published to a topic, exactly once with its Postgres commit.

Two shapes. `rows`: one message per visible input record, in the input's order, its key and JSON value
from expressions, with headers naming the pipeline, the batch, its kind, the source record and its
range; Spark computes the messages, and they are produced as they reach the driver (a `Publication`,
opened before the read). `changelog_of: <table>` (an aggregate's or upsert's table): one message per
key whose row changed, keyed by the table's primary key, its value the new row (or a tombstone), so a
compacted topic converges to the table; Postgres captures the keys (kafka_batch.sinks.changelog), and
the commit produces them. Either way one Kafka transaction with the batch's identity
(kafka_batch.kafka.publish) commits last in the commit transaction, so a crash at any point neither
loses nor repeats a batch; docs/design.md has the argument.

A published message cannot be taken back. For `rows`, `remove` (a replay's or a rewind's) changes
nothing in the topic: a replay publishes its records again, marked `kafka_batch.kind: replay`; after a
rewind, the batches that read the ranges again publish them again (`kafka_batch.source` names the
record, so a consumer can tell). A changelog needs no such rule: a replay or a rewind changes the
table, and every key it changed is published with its corrected row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import model_validator

from kafka_batch.errors import InputError, StateError
from kafka_batch.kafka.publish import Decision, Message, Published, Publisher, decide
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.model import Expression, Identifier, PositiveInt, TopicName
from kafka_batch.sinks import base, changelog
from kafka_batch.sinks.base import RangeCounts, Sink, SinkOutput, StageContext, TableSink, range_counts

if TYPE_CHECKING:  # pyarrow where a sink computes (see kafka_batch.sinks)
    import pyarrow as pa

HEADER_BYTES = 512  # what a message's size check allows for its headers (pipeline, batch, kind, source, range)
HEADERS = ("pipeline", "batch", "kind", "source", "range")  # the lineage headers a message may carry
PUBLISH_RATE = 50_000  # messages a second a publish is assumed to reach at least (a quarter of one core's)
# The rows shape's result, as its publish reads it: per message its range, offset, key and value.
PUBLISHED = ("range_id", "offset", "_key", "_value")
# Messages turned into Python objects at a time: a publish holds a piece of the result as Arrow (the whole
# result under spark-submit: about 100 MB a million messages), not a Python object per field of every
# message (another 250 MB a million).
CHUNK_ROWS = 65_536


class KafkaSink(Sink):
    """Results published to a topic: every visible record (`sinks: {kafka: {topic, key, value}}`), or the
    changes of an aggregate's or upsert's table (`sinks: {kafka: {topic, changelog_of: <table>}}`)."""

    kind = "kafka"
    publishes = True
    topic: TopicName
    """The output topic, on the pipeline's Kafka connection. It must exist: a batch that finds it missing
    fails with one line and commits nothing."""
    key: Expression | None = None
    """Shape rows: a Spark SQL expression whose text is each message's key (UTF-8); none: no key."""
    value: base.columns(base.ColumnSpec) | None = None
    """Shape rows: each message's value, a JSON object of these fields (`name: expr`, or `{expr, type}`)."""
    changelog_of: Identifier | None = None
    """Shape changelog: the table of the pipeline's aggregate or upsert sink whose changes are published,
    one message per changed key (key: the primary key as a JSON object; value: the row as a JSON object,
    or a tombstone for a deleted key). Use a compacted topic: it converges to the table."""
    value_format: Literal["json", "avro", "protobuf"] = "json"
    """`json`: values are JSON objects. `avro`, `protobuf`: records in the Confluent wire format, their schema
    made from the value's columns (rows) or the table's (changelog), registered under `<topic>-value` in
    the Schema Registry of `connections.schema_registry` (kafka_batch.formats.writing has the mapping)."""
    max_message_bytes: PositiveInt = 1_000_000
    """Shape rows: a record whose message (key and value, plus 512 bytes for the headers) would be larger
    is invalid, quarantined with its reason (so no sink processes it), instead of failing every attempt at
    the broker. At most the topic's `max.message.bytes` (Kafka's default: 1,048,588)."""
    headers: list[Literal[HEADERS]] = list(HEADERS)  # type: ignore[valid-type]
    """The lineage headers each message carries, as `kafka_batch.<name>`: `pipeline`; `batch`, its id;
    `kind`, `batch` or `replay`; and in shape rows `source`, its record (`topic:partition:offset`), and
    `range`, the record's range (`topic:partition:from-until`). `[]` sends none: the fastest (headers cost
    a producer about as much as the rest of a small message), and exactly once all the same (the batch's
    identity is in the publish group), but a consumer can then neither trace a message to its record nor
    tell a replay's messages from the first ones."""
    transaction_timeout_seconds: PositiveInt = 900
    """The producer's `transaction.timeout.ms`, in seconds: how long an open transaction of a killed
    attempt can hold `read_committed` readers back, at most (`kafka-batch fence` ends it sooner). It must
    outlast a batch's read and publish: a definition where it is shorter than `limits.max_records_per_batch`
    messages at 50,000 a second plus three `read.kafka_timeout_seconds` is refused. At most the broker's
    `transaction.max.timeout.ms` (default 900)."""

    call_timeout_seconds: PositiveInt = 60
    """How long each of the producer's calls waits for the brokers (starting the transactional producer,
    reading the publish group, committing or aborting the transaction). A call that does not return within
    it and 15 s more ends the attempt as a retried error, whatever the Kafka client does with its own
    timeout (a coordinator's node that dies or hangs can hold librdkafka past it); the next attempt
    fences the producer and finds out whether the batch was published."""

    @model_validator(mode="after")
    def _one_shape(self) -> KafkaSink:
        if (self.value is None) == (self.changelog_of is None):
            raise ValueError("give either value (one message per record) or changelog_of (a table's changes)")
        if self.changelog_of is not None and self.key is not None:
            raise ValueError("a changelog's messages are keyed by its table's primary key: leave key out")
        return self

    def problem_with(self, pipeline) -> str | None:
        keyed = {sink.table for sink in pipeline.sinks if isinstance(sink, TableSink) and sink.keyed}
        if self.changelog_of is not None and self.changelog_of not in keyed:
            return (f"changelog_of names table {self.changelog_of!r}, which no aggregate or upsert sink of the pipeline"
                    f" writes (keyed tables: {sorted(keyed) or 'none'})")
        publish = pipeline.limits.max_records_per_batch / PUBLISH_RATE + 3 * pipeline.read.kafka_timeout_seconds
        if self.transaction_timeout_seconds < publish:
            return (f"sinks.kafka.transaction_timeout_seconds {self.transaction_timeout_seconds} is shorter than a"
                    f" batch's publish can take ({publish:.0f} s: limits.max_records_per_batch"
                    f" {pipeline.limits.max_records_per_batch} messages at {PUBLISH_RATE:,} a second, and three"
                    f" read.kafka_timeout_seconds {pipeline.read.kafka_timeout_seconds:g}); the broker would abort"
                    " long publishes. Raise it, or lower limits.max_records_per_batch")
        return None

    def invalid_when(self) -> list[tuple[Any, Any]]:
        """A record whose message would be over max_message_bytes (the broker would refuse it)."""
        if self.value is None:
            return []
        from pyspark.sql import functions as F

        size = F.coalesce(F.octet_length(self._key()), F.lit(0)) + F.octet_length(self._value()) + HEADER_BYTES
        return [(size > self.max_message_bytes, F.format_string(
            f"its message to Kafka topic {self.topic} would be %d bytes, over sinks.kafka.max_message_bytes"
            f" {self.max_message_bytes}", size))]

    def _key(self):
        from pyspark.sql import functions as F

        return F.expr(self.key).cast("string") if self.key else F.lit(None).cast("string")

    def _row(self):
        from pyspark.sql import functions as F

        return F.struct(*[F.expr(c.expr).cast(c.spark_type).alias(c.name) for c in self.value])

    def _value(self):
        from pyspark.sql import functions as F

        return F.to_json(self._row())

    @property
    def uses_registry(self) -> bool:
        return self.value_format != "json"

    @property
    def columns_used(self) -> tuple[base.Column, ...]:
        return tuple(column for _, column in self.expressions())

    def expressions(self) -> tuple[tuple[str, base.Column], ...]:
        key = (("key", base.Column("_key", self.key, "text")),) if self.key else ()
        return key + base.at("value", self.value or ())

    @property
    def publishes_tables(self) -> tuple[str, ...]:
        return () if self.changelog_of is None else (self.changelog_of,)

    def create(self, cur, pipeline_name: str) -> None:
        """A changelog: capture its table's changed keys (after the table sinks created it). Nothing else:
        the topic is the operator's to create (with its partitions, retention or compaction)."""
        if self.changelog_of is not None:
            changelog.install(cur, pipeline_name, self.changelog_of)

    def open(self, batch, attempt: int, kafka_config: dict, pending: dict[int, str],
             registry_config: dict | None = None) -> Publication | None:
        """The rows shape's publish, opened before the read so that its messages go out while Spark
        computes them: every older producer of the topic fenced, and the decision taken (`decide`: it
        holds until the commit, since only a newer producer, which fences this one, could change it).
        `pending`: the batches Postgres may still commit. A changelog publishes in the commit: None."""
        if self.changelog_of is not None:
            return None
        publisher = self._fenced(kafka_config, batch, pending)
        if publisher is None:
            return Publication(None, batch, attempt)
        try:
            encode = self._encoder([(c.name, c.type) for c in self.value], registry_config)
        except BaseException:
            publisher.close()
            raise
        return Publication(publisher, batch, attempt, encode, self.headers)

    def compute(self, records, stage: StageContext) -> SinkOutput:
        """Rows: one Spark pass, per record its key and JSON value (null for tombstones and invalid
        records, which are counted, never published), streamed to the driver in the input's order and
        handed, piece by piece, to the attempt's open publication (`stage.publication`), a task at a time
        (`stage.waves`): the driver holds a few pieces, Spark a few tasks' (see base.stream_waves).
        A changelog computes nothing: its messages come from the table, in the commit."""
        if self.changelog_of is not None:
            return SinkOutput(None, None)
        from pyspark.sql import functions as F

        valid = ~F.col("_tombstone") & F.col("_invalid").isNull()

        def messages(frame):  # the source record's name is made in the driver, from its range and offset
            return frame.select(
                "range_id", "offset", "_tombstone", F.col("_invalid").isNotNull().alias("_invalid"),
                F.when(valid, self._key()).alias("_key"),
                F.when(valid, self._value() if self.value_format == "json" else self._row()).alias("_value"),
            )

        waves = [records] if stage.waves is None else stage.waves()
        counts: dict[int, RangeCounts] = {}
        for piece in in_input_order(base.stream_waves(map(messages, waves), stage.cores), stage.tasks):
            for range_id, more in _counts(piece).items():
                counts[range_id] = _sum(counts.get(range_id, RangeCounts()), more)
            if stage.publication is not None:
                stage.publication.send(_published(piece))
        return SinkOutput(counts, stage.publication)

    def apply(self, cur, result) -> int:
        """Nothing in Postgres: the messages go out in `publish`, last in the commit."""
        return 0

    def publish(self, cur, result: Publication | None, batch, attempt: int, kafka_config: dict,
                pending: dict[int, str], registry_config: dict | None = None) -> int:
        """Rows: commit the attempt's publication (its messages were produced while Spark computed them).
        A changelog's outbox is emptied only by a publish: an attempt that completes a batch an earlier
        attempt published leaves it, and the next batch sends those keys' rows again (the same rows, which
        a compacted topic absorbs), rather than losing a change committed since (an operator's edit)."""
        if self.changelog_of is None:
            if result is None:
                raise StateError(f"batch {batch.id}: the Kafka sink's publication was not opened before the read")
            return result.commit()
        publisher = self._fenced(kafka_config, batch, pending)
        if publisher is None:
            return 0
        try:
            columns = changelog.columns(cur, self.changelog_of)
            messages = _changes(changelog.take(cur, self.changelog_of), batch, self._encoder(columns, registry_config),
                                self.headers)
            return publisher.publish(messages, Published(batch.id, attempt, batch.kind))
        finally:
            publisher.close()

    def _fenced(self, kafka_config: dict, batch, pending: dict[int, str]) -> Publisher | None:
        """The topic's producer for this attempt, every older one fenced, if the batch is still to publish
        (`decide`) and the topic can take its messages now (`check_writable`); None, its producer closed,
        if an earlier attempt's transaction committed it."""
        publisher = Publisher(kafka_config, batch.pipeline, self.topic, timeout=self.call_timeout_seconds,
                              transaction_timeout_ms=self.transaction_timeout_seconds * 1000,
                              message_max_bytes=self.max_message_bytes + HEADER_BYTES)
        try:
            publisher.fence()
            found = publisher.published({(r.topic, r.partition) for r in batch.ranges})
            publishes = decide(batch.id, found, pending) is Decision.PUBLISH
            if publishes:
                publisher.check_writable()
        except BaseException:
            publisher.close()
            raise
        if not publishes:
            publisher.close()
            return None
        return publisher

    def _encoder(self, columns: list[tuple[str, str]], registry_config: dict | None):
        """A value's bytes from its row: Avro or Protobuf through the registry; JSON (a changelog's rows are dicts; the
        rows shape's values are JSON text from Spark already)."""
        if self.uses_registry:
            from kafka_batch.formats.writing import RegistryValues  # the registry client's imports: only here

            if registry_config is None:
                raise InputError(f"the Kafka sink writes {self.value_format} to {self.topic!r}: it needs the Schema"
                                 " Registry connection (connections.schema_registry)")
            return RegistryValues(registry_config, self.topic, self.value_format, columns).encode
        return _json if self.changelog_of is not None else None

    def remove(self, cur, ranges: Sequence[OffsetRange]) -> int:
        """What was published stays published (see the module's docstring)."""
        return 0

    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: Any) -> int:
        return 0


class Publication:
    """One attempt's publish of the rows shape, open from the read to the commit: its messages go into
    the attempt's Kafka transaction as Spark computes them, and the commit completes it, last. Without
    a publisher, an earlier attempt published the batch already: nothing is sent."""

    def __init__(self, publisher: Publisher | None, batch, attempt: int, encode=None, headers: Sequence[str] = HEADERS):
        self._publisher, self._batch, self._encode, self._headers = publisher, batch, encode, headers
        self._identity = Published(batch.id, attempt, batch.kind)
        self.produced = 0

    def send(self, table: pa.Table) -> None:
        if self._publisher is not None:
            messages = _messages(table, self._batch, self._encode, self._headers)
            self.produced += self._publisher.produce(messages, self._identity)

    def commit(self) -> int:
        """Commit the messages sent, with the batch's identity; how many they were."""
        if self._publisher is not None:
            self._publisher.commit(self._identity)
        return self.produced

    def close(self) -> None:
        """Abort what was not committed (a failed attempt's messages are never visible)."""
        if self._publisher is not None:
            self._publisher.close()


def in_input_order(pieces: Iterable[pa.Table], tasks: Sequence[Sequence[OffsetRange]]) -> Iterator[pa.Table]:
    """A read's rows as they arrive in task order (Spark's partition order), each partition's in offset
    order. Within a range the tasks keep that order (ranges.pack_tasks); a partition with several ranges
    (a replay of several batches) has its later ranges' rows held until the earlier ranges are complete,
    that is until a later task than any that reads them arrives."""
    partition_of: dict[int, tuple[str, int]] = {}
    last_task: dict[int, int] = {}  # range id -> the last task that reads a piece of it
    starts: dict[int, list[tuple[int, int]]] = {}  # range id -> (from offset, task) of its pieces
    for task, pieces_of_task in enumerate(tasks):
        for piece in pieces_of_task:
            partition_of[piece.range_id] = (piece.topic, piece.partition)
            last_task[piece.range_id] = task
            starts.setdefault(piece.range_id, []).append((piece.from_offset, task))
    queues: dict[tuple[str, int], list[int]] = {}  # partition -> its ranges in offset order, the first not complete
    for range_id in sorted(starts, key=lambda r: min(starts[r])):
        queues.setdefault(partition_of[range_id], []).append(range_id)
    queues = {where: queue for where, queue in queues.items() if len(queue) > 1}
    if not queues:  # one range per partition: the order of arrival is the order
        yield from pieces
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    held: dict[int, list[pa.Table]] = {}

    def release(done_before: int) -> Iterator[pa.Table]:
        """Advance each partition past its complete ranges; the new first range's held rows go out."""
        for queue in queues.values():
            while len(queue) > 1 and last_task[queue[0]] < done_before:
                queue.pop(0)
                yield from held.pop(queue[0], [])

    for piece in pieces:
        if piece.num_rows == 0:
            continue
        range_id, offset = piece["range_id"][0].as_py(), piece["offset"][0].as_py()  # a piece comes from one task
        task = max(t for start, t in starts[range_id] if start <= offset)
        yield from release(task)
        waiting = [range_id for queue in queues.values() for range_id in queue[1:]]
        later = pc.is_in(piece["range_id"], value_set=pa.array(waiting, piece["range_id"].type))
        if not pc.any(later).as_py():
            yield piece
            continue
        yield piece.filter(pc.invert(later))
        for waiting_id in waiting:
            rows = piece.filter(pc.equal(piece["range_id"], waiting_id))
            if rows.num_rows:
                held.setdefault(waiting_id, []).append(rows)
    for queue in queues.values():
        for range_id in queue:
            yield from held.pop(range_id, [])


def _counts(table: pa.Table) -> dict[int, RangeCounts]:
    """Per range, from each message's flags (base.range_counts sums them)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    invalid, tombstones = table["_invalid"], table["_tombstone"]
    return range_counts(pa.table({
        "range_id": table["range_id"],
        "records": pc.cast(pc.invert(pc.or_(invalid, tombstones)), pa.int64()),
        "tombstones": pc.cast(tombstones, pa.int64()), "invalid": pc.cast(invalid, pa.int64()),
    }))


def _sum(a: RangeCounts, b: RangeCounts) -> RangeCounts:
    return RangeCounts(a.records + b.records, a.tombstones + b.tombstones, a.invalid + b.invalid)


def _published(table: pa.Table) -> pa.Table:
    """The messages to publish, in their order: neither tombstones nor invalid records."""
    import pyarrow.compute as pc
    return table.filter(pc.invert(pc.or_(table["_tombstone"], table["_invalid"]))).select(list(PUBLISHED))


def _batch_headers(batch, wanted: Sequence[str]) -> list[tuple[str, str]]:
    """The headers every message of the batch carries, of those `wanted`."""
    return [(f"kafka_batch.{name}", value) for name, value in (
        ("pipeline", batch.pipeline), ("batch", str(batch.id)), ("kind", batch.kind)) if name in wanted]


def _json(row: dict | None) -> str | None:
    """A changelog row as compact JSON (times in ISO 8601, as Postgres gives them to JSON)."""
    return None if row is None else json.dumps(row, separators=(",", ":"), default=lambda v: v.isoformat())


def _changes(changes: list[tuple[str, dict | None]], batch, encode, wanted: Sequence[str]) -> Iterator[Message]:
    """A changelog's messages: per changed key its row (None: a tombstone), headed by the batch."""
    headers = _batch_headers(batch, wanted) or None
    for key, row in changes:
        yield Message(key, encode(row), headers)


def _messages(table: pa.Table, batch, encode=None, wanted: Sequence[str] = HEADERS) -> Iterator[tuple]:
    """The messages with the headers `wanted`: pipeline, batch, kind, the source record and its range. A
    batch makes millions: each is a plain (key, value, headers) tuple, its headers one list, and the
    source's name (`topic:partition:offset`) is joined by Arrow, a chunk at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fixed = _batch_headers(batch, wanted)
    ranges = batch.ranges
    range_ids = pa.array([r.range_id for r in ranges], pa.int64())
    prefixes = pa.array([f"{r.topic}:{r.partition}:" for r in ranges])
    after = {r.range_id: [("kafka_batch.range", f"{r.topic}:{r.partition}:{r.from_offset}-{r.until_offset}")]
             if "range" in wanted else [] for r in ranges}
    sources = "source" in wanted
    shared = {range_id: [*fixed, *these] or None for range_id, these in after.items()}  # produce copies them
    for chunk in table.to_batches(max_chunksize=CHUNK_ROWS):
        ids = chunk.column("range_id")
        keys, values = chunk.column("_key").to_pylist(), chunk.column("_value").to_pylist()
        if encode is not None:
            values = [encode(row) for row in values]
        if sources:  # str keys, values and headers: UTF-8
            names = pc.binary_join_element_wise(pc.take(prefixes, pc.index_in(ids, value_set=range_ids)),
                                                pc.cast(chunk.column("offset"), pa.string()), "")
            for key, value, range_id, name in zip(keys, values, ids.to_pylist(), names.to_pylist(), strict=True):
                yield key, value, [*fixed, ("kafka_batch.source", name), *after[range_id]]  # made as it goes: no GC
        else:
            yield from zip(keys, values, [shared[range_id] for range_id in ids.to_pylist()], strict=True)
