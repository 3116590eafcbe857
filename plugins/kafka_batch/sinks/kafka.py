"""The Kafka sink: a batch's output published to a topic, exactly once with its Postgres commit.

Shape `rows` (the first one built): one message per visible input record, in the input's order, its
key and JSON value from expressions, with headers naming the pipeline, the batch, its kind, the source
record and its range. Spark computes the messages; the commit transaction publishes them last, through
kafka_batch.kafka_publish (one Kafka transaction with the batch's identity), so a crash at any point
neither loses nor repeats them; docs/design.md has the argument.

A published message cannot be taken back: `remove` (a replay's or a rewind's) changes nothing in the
topic. A replay publishes its records again, marked `kafka_batch.kind: replay`; after a rewind, the
batches that read the ranges again publish them again (`kafka_batch.source` names the record, so a
consumer can tell).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka_batch.kafka_publish import Decision, Message, Published, Publisher, decide
from kafka_batch.model import Expression, TopicName
from kafka_batch.ranges import OffsetRange
from kafka_batch.sinks import base
from kafka_batch.sinks.base import RangeCounts, Sink, SinkOutput, StageContext


class KafkaSink(Sink):
    """Every visible record as one message on a topic: `sinks: {kafka: {topic, key, value}}`."""

    kind = "kafka"
    publishes = True
    topic: TopicName
    """The output topic, on the pipeline's Kafka connection. It must exist: a batch that finds it missing
    fails with one line and commits nothing."""
    key: Expression | None = None
    """A Spark SQL expression whose text is each message's key (UTF-8); none: messages have no key."""
    value: base.columns(base.ColumnSpec)
    """Each message's value: a JSON object of these fields (`name: expr`, or `{expr, type}`)."""

    @property
    def columns_used(self) -> tuple[base.Column, ...]:
        return self.value

    def create(self, cur, pipeline_name: str) -> None:
        """Nothing in Postgres: the topic is the operator's to create (with its partitions and retention)."""

    def compute(self, records, stage: StageContext) -> SinkOutput:
        """One Spark pass: per record its key and JSON value (null for tombstones and invalid records,
        which are counted, never published), then to the driver in the input's order."""
        from pyspark.sql import functions as F

        valid = ~F.col("_tombstone") & F.col("_invalid").isNull()
        key = F.expr(self.key).cast("string") if self.key else F.lit(None).cast("string")
        value = F.to_json(F.struct(*[F.expr(c.expr).cast(c.spark_type).alias(c.name) for c in self.value]))
        table = records.select(
            "range_id", "topic", "partition", "offset", "_tombstone", F.col("_invalid").isNotNull().alias("_invalid"),
            F.when(valid, key).alias("_key"), F.when(valid, value).alias("_value"),
            F.concat_ws(":", "topic", "partition", "offset").alias("_source"),
        ).toArrow()
        table = table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
        return SinkOutput(_counts(table), table.filter(pc.invert(pc.or_(table["_tombstone"], table["_invalid"]))))

    def apply(self, cur, result: pa.Table) -> int:
        """Nothing in Postgres: the messages go out in `publish`, last in the commit."""
        return 0

    def publish(self, result: pa.Table, batch, attempt: int, kafka_config: dict, pending: dict[int, str]) -> int:
        publisher = Publisher(kafka_config, batch.pipeline, self.topic)
        try:
            publisher.fence()
            found = publisher.published({(r.topic, r.partition) for r in batch.ranges})
            if decide(batch.id, found, pending) is Decision.COMPLETE:
                return 0
            return publisher.publish(_messages(result, batch), batch.ranges, Published(batch.id, attempt, batch.kind))
        finally:
            publisher.close()

    def remove(self, cur, ranges: Sequence[OffsetRange]) -> int:
        """What was published stays published (see the module's docstring)."""
        return 0

    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: Any) -> int:
        return 0


def _counts(table: pa.Table) -> dict[int, RangeCounts]:
    invalid, tombstones = table["_invalid"], table["_tombstone"]
    flags = pa.table({
        "range_id": table["range_id"],
        "records": pc.cast(pc.invert(pc.or_(invalid, tombstones)), pa.int64()),
        "tombstones": pc.cast(tombstones, pa.int64()), "invalid": pc.cast(invalid, pa.int64()),
    })
    totals = flags.group_by("range_id").aggregate([("records", "sum"), ("tombstones", "sum"), ("invalid", "sum")])
    return {row["range_id"]: RangeCounts(row["records_sum"], row["tombstones_sum"], row["invalid_sum"])
            for row in totals.to_pylist()}


def _messages(table: pa.Table, batch) -> Iterator[Message]:
    """The messages with their headers: pipeline, batch, kind, the source record and its range."""
    fixed = [("kafka_batch.pipeline", batch.pipeline), ("kafka_batch.batch", str(batch.id)),
             ("kafka_batch.kind", batch.kind)]
    ranges = {r.range_id: ("kafka_batch.range", f"{r.topic}:{r.partition}:{r.from_offset}-{r.until_offset}")
              for r in batch.ranges}
    columns = [table[name].to_pylist() for name in ("range_id", "_source", "_key", "_value")]
    for range_id, source, key, value in zip(*columns, strict=True):  # str keys, values and headers: UTF-8
        yield Message(key, value, [*fixed, ("kafka_batch.source", source), ranges[range_id]])
