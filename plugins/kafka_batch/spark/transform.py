"""Records -> parsed records: the pipeline's fields next to the record's metadata, validated.

Every sink computes from this one DataFrame. Tombstones (null values) stay, flagged `_tombstone`, so
sinks can count them; `_deleted` flags the records that say their key is gone (a tombstone, or an
envelope's delete event: kafka_batch.spark.envelope unwraps the fields and adds its columns). A record
the pipeline cannot process (a value over `max_value_bytes`, not a JSON object with the declared
fields, an Avro or Protobuf value its reader could not decode, not an event of its envelope, a null
where a sink needs a key, or what a sink cannot take, as a Kafka message over its limit) gets its
reason in `_invalid`; sinks skip it and count it, and the job quarantines it. Under
`on_invalid_record: fail` such a record stops the batch instead, with raise_error naming its topic,
partition and offset.
Avro and Protobuf values are decoded by the reader (`formats`): their fields are the top-level fields
of the record (`record` is the whole of it). JSON: the reader may have parsed the fields already
(`json_fields`, pyarrow, where it gives what from_json gives); from_json then parses only the records
it left. Pure DataFrame -> DataFrame: tested on a local session.
"""

from __future__ import annotations

import functools
import operator

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kafka_batch.config import Pipeline
from kafka_batch.errors import INVALID_RECORD
from kafka_batch.formats.columns import decoded_column, error_column
from kafka_batch.spark.envelope import Unwrapped, value_schema
from kafka_batch.spark.json_fields import PARSED, field_column
from kafka_batch.spark.reader import VALUE_BYTES

_PROBLEM = "_envelope_problem"
_LENGTH = "_value_length"  # of the value, null for a tombstone: the reader's VALUE_BYTES when it left values out
METADATA = ("range_id", "topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value")
# What a quarantine row keeps of a record (its value is cut to QUARANTINE_KEEP_BYTES; the length is kept).
QUARANTINE_COLUMNS = ("range_id", "topic", "partition", "offset", "timestamp", "key", "value", "value_bytes", "reason")
QUARANTINE_KEEP_BYTES = 65_536


def _reason(pipeline: Pipeline) -> Column:
    """Why a record cannot be processed, or null; the first reason that applies. Each condition is a
    plain test; the message is built only for the invalid records (a sixth of Spark's work otherwise).
    An Avro record is valid when its schema's resolution gives it: a null there is the schema's."""
    json = pipeline.record.format == "json"
    missing = {n: F.col(n).isNull() for n in pipeline.fields} if json else {}
    null_keys = {f"{sink.kind}.{c.name}": F.expr(c.expr).cast(c.spark_type).isNull()
                 for sink in pipeline.sinks for c in sink.required_columns}
    limit = pipeline.limits.max_value_bytes
    reason = (
        F.when(F.col("_tombstone"), F.lit(None))
        .when(F.col(_LENGTH) > limit, F.format_string(f"value of %d bytes is over max_value_bytes {limit}",
                                                        F.col(_LENGTH)))
    )
    for error in _decode_errors(pipeline):
        reason = reason.when(F.col(error).isNotNull(), F.col(error))
    if pipeline.record.envelope is not None:  # not an event of the envelope; a delete may lack fields
        reason = reason.when(F.col(_PROBLEM).isNotNull(), F.col(_PROBLEM))
    if missing:
        lacking = _any(missing)
        if pipeline.record.envelope is not None:
            lacking = ~F.col("_deleted") & lacking
        reason = reason.when(lacking, F.format_string(
            "not a JSON object with the fields %s (missing, null or mistyped: %s)",
            F.lit(", ".join(f"{n}: {t}" for n, t in pipeline.fields.items())), _names_where(missing)))
    if null_keys:
        reason = reason.when(_any(null_keys), F.format_string("null key(s) %s", _names_where(null_keys)))
    for sink in pipeline.sinks:  # e.g. a Kafka message over its size limit
        for condition, why in sink.invalid_when():
            reason = reason.when(condition, why)
    return reason


def _any(conditions: dict[str, Column]) -> Column:
    return functools.reduce(operator.or_, conditions.values())


def _names_where(conditions: dict[str, Column]) -> Column:
    return F.concat_ws(", ", *[F.when(condition, F.lit(name)) for name, condition in conditions.items()])


def parse_records(records: DataFrame, pipeline: Pipeline) -> DataFrame:
    flat = _flat(records, pipeline)
    checked = flat.withColumn("_invalid", _reason(pipeline)).drop(_PROBLEM, _LENGTH, *_decode_errors(pipeline))
    if pipeline.on_invalid_record == "quarantine":
        return checked
    rejected = F.raise_error(F.format_string(
        f"{INVALID_RECORD} %s[%d] at offset %d (pipeline {pipeline.name}): %s",
        F.col("topic"), F.col("partition"), F.col("offset"), F.col("_invalid"),
    ))
    # A filter, not a column: Spark evaluates it for every record whatever columns a sink selects.
    return checked.where(F.when(F.col("_invalid").isNull(), F.lit(True)).otherwise(rejected))


def expression_scope(records: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The columns a sink's expressions see, with their types: `parse_records`' columns, built without
    the sinks' own conditions (kafka_batch.spark.analysis resolves those expressions against it)."""
    return _flat(records, pipeline).drop(_PROBLEM, _LENGTH, *_decode_errors(pipeline)).withColumn(
        "_invalid", F.lit(None).cast("string"))


def _flat(records: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The record's metadata and fields, flags and the inputs of `_reason`, one column each."""
    envelope = pipeline.record.envelope
    if pipeline.record.format != "json":  # decoded by the reader (formats.avro, formats.protobuf)
        parsed = records
        value = Unwrapped(F.col(decoded_column("value")), envelope, tuple(pipeline.record.view.fields))
        fields = [value.field(name).alias(name) for name in pipeline.fields] + [value.row.alias("record")]
        if pipeline.record.key is not None:
            fields.append(F.col(decoded_column("key")).alias("record_key"))
    else:
        parsed, value, fields = _json_fields(records, pipeline)
    # The reader may build only the record columns the pipeline uses (kafka_batch.spark.reader).
    columns = records.columns
    metadata = [c for c in METADATA if c in columns]
    length = F.col(VALUE_BYTES) if VALUE_BYTES in columns else F.length("value")
    tombstone = length.isNull()
    return parsed.select(*metadata, *fields, *value.extra, *_decode_errors(pipeline), tombstone.alias("_tombstone"),
                         (tombstone | value.deleted).alias("_deleted"), value.problem.alias(_PROBLEM),
                         length.alias(_LENGTH))


def _decode_errors(pipeline: Pipeline) -> list[str]:
    """The reader's columns of why a value (or key) could not be decoded."""
    if pipeline.record.format == "json":
        return []
    return [error_column("value")] + ([error_column("key")] if pipeline.record.key is not None else [])


def _json_fields(records: DataFrame, pipeline: Pipeline) -> tuple[DataFrame, Unwrapped, list[Column]]:
    """The JSON fields: as the reader parsed them (json_fields), else by from_json."""
    text = F.col("value").cast("string")
    in_reader = PARSED in records.columns
    if in_reader:
        text = F.when(~F.col(PARSED), text)  # null, so nothing to parse, where the reader parsed
    envelope = pipeline.record.envelope
    parsed = records.withColumn("_parsed", F.from_json(text, value_schema(pipeline.fields, envelope)))
    value = Unwrapped(F.col("_parsed"), envelope)

    def field(name: str) -> Column:
        by_spark = value.field(name)
        return (F.when(F.col(PARSED), F.col(field_column(name))).otherwise(by_spark) if in_reader else by_spark).alias(name)

    return parsed, value, [field(name) for name in pipeline.fields]


def invalid_records(parsed: DataFrame) -> DataFrame:
    """The quarantine rows of a batch's parsed records (small: bounded by max_invalid_ratio)."""
    return parsed.where(F.col("_invalid").isNotNull()).select(
        "range_id", "topic", "partition", "offset", "timestamp", "key",
        F.substring("value", 1, QUARANTINE_KEEP_BYTES).alias("value"),
        F.length("value").alias("value_bytes"), F.col("_invalid").alias("reason"),
    )

