"""Records -> per-range aggregates, as one Spark SQL pass (the pipeline's expressions, vectorized).

Output: one row per (range_id, group keys) with the measures, plus `records` and `tombstones`
counts; tombstones (null values) form rows with null keys and zero records. A record that cannot be
parsed, or lacks a field or a key, stops the batch with raise_error naming topic, partition and offset.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kafka_batch.config import COLUMN_TYPES, MEASURE_TYPES, Pipeline


def _json_schema(pipeline: Pipeline) -> str:
    return ", ".join(f"`{name}` {ftype}" for name, ftype in pipeline.fields.items())


def _rejection(pipeline: Pipeline, missing: Column) -> Column:
    return F.raise_error(
        F.format_string(
            f"pipeline {pipeline.name}: record %s[%d] at offset %d cannot be aggregated:"
            " not a JSON object with the fields %s (missing, null or mistyped: %s)",
            F.col("topic"), F.col("partition"), F.col("offset"),
            F.lit(", ".join(f"{n}: {t}" for n, t in pipeline.fields.items())), missing,
        )
    )


def aggregate(records: DataFrame, pipeline: Pipeline) -> DataFrame:
    parsed = records.withColumn("_parsed", F.from_json(F.col("value").cast("string"), _json_schema(pipeline)))
    fields = [F.col("_parsed").getField(name).alias(name) for name in pipeline.fields]
    flat = parsed.select("range_id", "topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", *fields)
    # Prefixed so a key may carry the name of the field it comes from (page: {expr: page}).
    keys = [F.expr(c.expr).cast(COLUMN_TYPES[c.type]).alias(f"__key_{c.name}") for c in pipeline.group_by]
    measures = [F.expr(c.expr).cast(MEASURE_TYPES[c.type]).alias(f"__measure_{c.name}") for c in pipeline.measures]
    projected = flat.select("range_id", "topic", "partition", "offset", "value", *pipeline.fields, *keys, *measures)

    checked = [(n, n) for n in pipeline.fields] + [(f"__key_{c.name}", f"key {c.name}") for c in pipeline.group_by]
    missing = F.concat_ws(", ", *[F.when(F.col(col).isNull(), F.lit(label)) for col, label in checked])
    is_tombstone = F.col("value").isNull()
    valid = (
        F.when(is_tombstone, F.lit(0))
        .when(F.length(missing) > 0, _rejection(pipeline, missing))
        .otherwise(F.lit(1))
    )
    return (
        projected.withColumn("_record", valid.cast("long"))
        .groupBy("range_id", *[F.col(f"__key_{c.name}").alias(c.name) for c in pipeline.group_by])
        .agg(
            *[
                F.coalesce(F.sum(f"__measure_{c.name}"), F.lit(0)).cast(MEASURE_TYPES[c.type]).alias(c.name)
                for c in pipeline.measures
            ],
            F.sum("_record").alias("records"),
            F.sum(is_tombstone.cast("long")).alias("tombstones"),
        )
    )
