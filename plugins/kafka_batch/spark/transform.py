"""Records -> parsed records: the pipeline's JSON fields next to the record's metadata, validated.

Every sink computes from this one DataFrame. Tombstones (null values) stay, flagged `_tombstone`,
so sinks can count them; a record that is not a JSON object with the declared fields stops the batch
with raise_error naming its topic, partition and offset. Pure DataFrame -> DataFrame: tested on a
local session.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_batch.config import Pipeline
from kafka_batch.errors import INVALID_RECORD

METADATA = ("range_id", "topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value")


def _json_schema(pipeline: Pipeline) -> str:
    return ", ".join(f"`{name}` {ftype}" for name, ftype in pipeline.fields.items())


def parse_records(records: DataFrame, pipeline: Pipeline) -> DataFrame:
    parsed = records.withColumn("_parsed", F.from_json(F.col("value").cast("string"), _json_schema(pipeline)))
    fields = [F.col("_parsed").getField(name).alias(name) for name in pipeline.fields]
    flat = parsed.select(*METADATA, *fields, F.col("value").isNull().alias("_tombstone"))
    missing = F.concat_ws(", ", *[F.when(F.col(n).isNull(), F.lit(n)) for n in pipeline.fields])
    rejected = F.raise_error(F.format_string(
        f"{INVALID_RECORD} %s[%d] at offset %d (pipeline {pipeline.name}):"
        " not a JSON object with the fields %s (missing, null or mistyped: %s)",
        F.col("topic"), F.col("partition"), F.col("offset"),
        F.lit(", ".join(f"{n}: {t}" for n, t in pipeline.fields.items())), missing,
    ))
    # A filter, not a column: Spark evaluates it for every record whatever columns a sink selects.
    return flat.where(F.when(F.col("_tombstone"), F.lit(True)).when(F.length(missing) > 0, rejected)
                      .otherwise(F.lit(True)))
