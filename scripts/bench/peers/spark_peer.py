"""Spark's own ways to read a batch from Kafka, as their users write them: the peers `make bench` runs.

Each reads the given offset ranges (or, streaming, the topic from their start to its end), decodes the
values (JSON with `from_json`; Avro with `from_avro` after the Confluent header, each writer schema from
the registry read as the newest), sums views and durations per group and minute, brings the totals to
the driver and commits them to Postgres with its progress in ONE transaction:

  batch          `spark.read.format("kafka")` with `startingOffsets`/`endingOffsets` as JSON (what
                 `KafkaUtils.createRDD` became); the offsets moved by compare-and-set
  available-now  Structured Streaming, `Trigger.AvailableNow`, `foreachBatch`: each micro-batch's totals
                 and its batch id in one transaction, a batch id already committed skipped (the idempotent
                 write Spark's guide describes); its checkpoint on local disk; started per run
  rdd            the original KafkaRDD (`KafkaUtils.createRDD` over the `OffsetRange`s, through py4j:
                 peers/KafkaRddRows.java makes its records rows); the offsets moved by compare-and-set

Run it with spark-submit (the connectors' jars on `--jars`) or against a Spark Connect server
(`--remote sc://...`, the connectors on the server's classpath; not `rdd`). It imports nothing of the
project, so its whole process is what a user's job costs. Prints the records it read.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

import psycopg2
from psycopg2.extras import execute_values
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

JSON_FIELDS = "user_id string, page string, duration_ms long"


def kafka_options(kafka: dict) -> dict[str, str]:
    """The Kafka source's consumer settings (`kafka.`-prefixed): the brokers, read_committed, the rest of
    the connection's librdkafka security settings, which the Java client names alike."""
    chosen = {k: v for k, v in kafka.items() if k == "bootstrap.servers" or k.startswith(("security.", "sasl.", "ssl."))}
    return {f"kafka.{k}": str(v) for k, v in {**chosen, "isolation.level": "read_committed"}.items()}


def offsets_json(ranges: list[tuple[str, int, int, int]], end: bool) -> str:
    """startingOffsets or endingOffsets as the Kafka source takes them: {"topic": {"partition": offset}}."""
    offsets: dict[str, dict[str, int]] = {}
    for topic, partition, start, until in ranges:
        offsets.setdefault(topic, {})[str(partition)] = until if end else start
    return json.dumps(offsets)


def read_batch(spark: SparkSession, kafka: dict, ranges) -> DataFrame:
    return (spark.read.format("kafka").options(**kafka_options(kafka))
            .option("subscribe", ",".join(sorted({r[0] for r in ranges})))
            .option("startingOffsets", offsets_json(ranges, end=False))
            .option("endingOffsets", offsets_json(ranges, end=True)).load())


def read_rdd(spark: SparkSession, kafka: dict, ranges) -> DataFrame:
    """KafkaUtils.createRDD over the ranges, its ConsumerRecords as rows (KafkaRddRows, on the driver's
    classpath), with the Kafka source's columns."""
    params = {"bootstrap.servers": kafka["bootstrap.servers"], "isolation.level": "read_committed",
              "group.id": "kafka-rdd-peer"}
    topics, partitions, starts, untils = (list(column) for column in zip(*ranges, strict=True))
    rows = spark.sparkContext._jvm.kafka_batch_peers.KafkaRddRows.rows(
        spark._jsparkSession, params, topics, partitions, starts, untils)
    return DataFrame(rows, spark)


def decoded(records: DataFrame, fmt: str, registry: str | None, topic: str) -> DataFrame:
    """The values as columns, with the record's `timestamp`."""
    if fmt == "json":
        return records.select(F.from_json(F.col("value").cast("string"), JSON_FIELDS).alias("v"), "timestamp") \
            .select("v.*", "timestamp")
    from pyspark.sql.avro.functions import from_avro

    writers = registry_schemas(registry, f"{topic}-value")
    reader = writers[max(writers)]  # the newest version: older records read with its defaults
    schema_id = F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("int")
    payload = F.expr("substring(value, 6)")
    value = None
    for writer_id, writer in writers.items():
        decode = from_avro(payload, writer, {"avroSchema": reader, "mode": "FAILFAST"})
        value = F.when(schema_id == writer_id, decode) if value is None else value.when(schema_id == writer_id, decode)
    return records.select(value.alias("v"), "timestamp").select("v.*")


def registry_schemas(url: str, subject: str) -> dict[int, str]:
    """{schema id: schema} of every version of the subject, from the Schema Registry's REST API."""
    def get(path: str):
        with urllib.request.urlopen(f"{url.rstrip('/')}/{path}", timeout=30) as answer:
            return json.load(answer)

    found = {}
    for version in get(f"subjects/{subject}/versions"):
        entry = get(f"subjects/{subject}/versions/{version}")
        found[entry["id"]] = entry["schema"]
    return found


def totals(values: DataFrame, groups: list[str], time_column: str) -> DataFrame:
    return (values.groupBy(*[F.col(g) for g in groups], F.date_trunc("minute", time_column).alias("minute"))
            .agg(F.count(F.lit(1)).alias("views"), F.sum("duration_ms").alias("total_duration_ms")))


def create_tables(postgres: dict, table: str, groups: list[str], ranges) -> None:
    key = ", ".join([*groups, "minute"])
    conn = psycopg2.connect(**postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} ({''.join(f'{g} text, ' for g in groups)}minute timestamptz,"
                    f" views bigint, total_duration_ms bigint, PRIMARY KEY ({key}))")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_offsets (topic text, partition int, next_offset bigint,"
                    " PRIMARY KEY (topic, partition))")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_batches (batch_id bigint PRIMARY KEY)")
        execute_values(cur, f"INSERT INTO {table}_offsets VALUES %s ON CONFLICT DO NOTHING",
                       [(topic, partition, start) for topic, partition, start, _ in ranges])
    conn.close()


def add_totals(cur, table: str, groups: list[str], rows) -> None:
    key = ", ".join([*groups, "minute"])
    execute_values(cur, f"INSERT INTO {table} VALUES %s ON CONFLICT ({key}) DO UPDATE SET"
                   f" views = {table}.views + EXCLUDED.views,"
                   f" total_duration_ms = {table}.total_duration_ms + EXCLUDED.total_duration_ms",
                   [tuple(r) for r in rows], page_size=10_000)


def commit_ranges(postgres: dict, table: str, groups: list[str], ranges, rows) -> None:
    """The totals added and every position moved by compare-and-set, in one transaction."""
    conn = psycopg2.connect(**postgres)
    with conn, conn.cursor() as cur:
        for topic, partition, start, until in ranges:
            cur.execute(f"UPDATE {table}_offsets SET next_offset = %s WHERE topic = %s AND partition = %s"
                        " AND next_offset = %s", (until, topic, partition, start))
            if cur.rowcount != 1:
                raise RuntimeError(f"compare-and-set lost on {topic}[{partition}] at {start}")
        add_totals(cur, table, groups, rows)
    conn.close()


def commit_micro_batch(postgres: dict, table: str, groups: list[str], batch_id: int, rows) -> bool:
    """A micro-batch's totals with its id, in one transaction; False (nothing written) when that id was
    committed before: a micro-batch Spark runs again after a failure."""
    conn = psycopg2.connect(**postgres)
    with conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table}_batches VALUES (%s) ON CONFLICT DO NOTHING", (batch_id,))
        written = cur.rowcount == 1
        if written:
            add_totals(cur, table, groups, rows)
    conn.close()
    return written


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    kafka, postgres = json.loads(args.kafka), json.loads(args.postgres)
    ranges = [tuple(r) for r in json.loads(args.ranges)]
    groups = args.group.split(",")
    time_column = "timestamp" if args.format == "json" else "viewed_at"
    topic = ranges[0][0]
    create_tables(postgres, args.table, groups, ranges)
    if args.mode in ("batch", "rdd"):
        records = (read_batch if args.mode == "batch" else read_rdd)(spark, kafka, ranges)
        rows = totals(decoded(records, args.format, args.registry, topic), groups, time_column).collect()
        commit_ranges(postgres, args.table, groups, ranges, rows)
        return sum(r["views"] for r in rows)

    def write(micro_batch: DataFrame, batch_id: int) -> None:  # on Spark Connect, runs in the server's Python
        rows = totals(decoded(micro_batch, args.format, args.registry, topic), groups, time_column).collect()
        commit_micro_batch(postgres, args.table, groups, batch_id, rows)

    stream = (spark.readStream.format("kafka").options(**kafka_options(kafka)).option("subscribe", topic)
              .option("startingOffsets", offsets_json(ranges, end=False)).load())
    query = (stream.writeStream.foreachBatch(write).trigger(availableNow=True)
             .option("checkpointLocation", args.checkpoint).start())
    query.awaitTermination()
    return sum(progress.numInputRows for progress in query.recentProgress)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("batch", "available-now", "rdd"), required=True)
    parser.add_argument("--kafka", required=True, help="librdkafka settings, JSON")
    parser.add_argument("--postgres", required=True, help="psycopg2.connect keyword arguments, JSON")
    parser.add_argument("--ranges", required=True, help="[[topic, partition, from, until], ...], JSON")
    parser.add_argument("--table", required=True)
    parser.add_argument("--format", choices=("json", "avro"), default="json")
    parser.add_argument("--group", default="page", help="the fields grouped by, with the minute (comma-separated)")
    parser.add_argument("--registry", help="the Schema Registry's URL (Avro)")
    parser.add_argument("--checkpoint", help="the stream's checkpoint directory (available-now)")
    parser.add_argument("--remote", help="a Spark Connect server (sc://host:port); else the spark-submit session")
    args = parser.parse_args()
    builder = SparkSession.builder.appName(f"spark peer {args.mode}")
    spark = builder.remote(args.remote).getOrCreate() if args.remote else builder.getOrCreate()
    try:
        print(run(spark, args))
    finally:
        if not args.remote:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
