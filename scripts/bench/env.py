"""The bench's services (from the environment `kafka-batch local up` writes), its pipelines (the samples on
bench topics, tables of their own) and the data it produces."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import yaml
from confluent_kafka import Producer

from bench.harness import CHILD_TIMEOUT_S
from kafka_batch import connections
from kafka_batch.config import PROJECT_ROOT, load_pipeline
from kafka_batch.core import database, planning
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch.spark import connect
from kafka_batch_dev import sample_data

# The two ways a batch reaches Spark (the pipeline's Spark connection): a long-lived Spark Connect server
# (the samples' connection, started by `kafka-batch local up`), and spark-submit per batch.
SUBMIT, CONNECT = "spark_default", "spark_connect_default"
MODE = {SUBMIT: "spark-submit", CONNECT: "Spark Connect"}
KAFKA_BATCH = str(Path(sys.executable).parent / "kafka-batch")


class Env:
    def __init__(self, prefix: str, pipelines: Path):
        self.prefix = prefix
        self.pipelines = pipelines
        self.kafka = connections.kafka_config(connections.from_environment("kafka_default"))
        self.postgres = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
        self.registry = connections.schema_registry_config(connections.from_environment("schema_registry_default"))
        self.spark_connect = connect.connection_url(connections.from_environment("spark_connect_default"))
        self.tables: list[tuple[str, str]] = []

    def pipeline(self, name: str, topic: str, spark: str = SUBMIT, group: str = "page", **limits):
        """The page_views sample on a bench topic; `group`: the field it groups by with the minute."""
        definition = self._sample("page_views", name, topic, spark, limits)
        definition["sinks"]["aggregate"]["group_by"]["page"]["expr"] = group
        return self._written(definition)

    def avro_pipeline(self, name: str, topic: str, spark: str = SUBMIT):
        """The page_views_avro sample on a bench topic."""
        return self._written(self._sample("page_views_avro", name, topic, spark, {}))

    def _sample(self, sample: str, name: str, topic: str, spark: str, limits: dict) -> dict:
        """A sample aggregate pipeline's definition on a bench topic, with a table of its own and no
        limit on a batch's size."""
        definition = yaml.safe_load((PROJECT_ROOT / "pipelines" / f"{sample}.yaml").read_text())
        name = f"{self.prefix}_{name}"
        definition.update(name=name, topics=topic if isinstance(topic, dict) else [topic], schedule=None)
        definition["connections"]["spark"] = spark
        definition["limits"] = {**definition.get("limits", {}), "max_records_per_partition": 10**9,
                                "max_records_per_batch": 10**9, **limits}
        definition["sinks"]["aggregate"]["table"] = f"{name}_minutes"
        return definition

    def publishing_pipeline(self, name: str, topic: str, output: str, spark: str = CONNECT, limits: dict | None = None,
                            headers: list[str] | None = None):
        """The page views, each published to `output` (key user_id; page and duration): a Kafka sink alone,
        its batches bounded to 10M records (a publish must fit the transaction's timeout); `headers`: the
        lineage headers its messages carry (default: all)."""
        definition = self._sample("page_views", name, topic, spark, {"max_records_per_batch": 10**7, **(limits or {})})
        definition["sinks"] = {"kafka": {"topic": output, "key": "user_id", "value": {
            "page": "page", "duration_ms": {"expr": "duration_ms", "type": "bigint"}},
            **({} if headers is None else {"headers": headers})}}
        return self._written(definition)

    def _written(self, definition: dict):
        """The pipeline of this definition, written among the bench's pipelines; its tables dropped at the end."""
        (self.pipelines / f"{definition['name']}.yaml").write_text(yaml.safe_dump(definition))
        # Its expressions analyzed once, untimed, as its first plan would (a local JVM for spark-submit).
        subprocess.run([KAFKA_BATCH, "validate", "--pipeline", definition["name"]], check=True, capture_output=True,
                       timeout=CHILD_TIMEOUT_S)
        pipeline = load_pipeline(definition["name"])
        for sink in pipeline.sinks:
            if sink.tables:
                self.tables += [("public", sink.table), ("kafka_batch", sink.contributions_name)]
        return pipeline

    def drop_tables(self) -> None:
        """The tables the bench's pipelines and peers made."""
        conn = database.connect(self.postgres)
        with conn, conn.cursor() as cur:
            for schema, table in self.tables:
                cur.execute(f'DROP TABLE IF EXISTS "{schema}"."{table}"')
        conn.close()

    def plan(self, pipeline, run_id: str = "bench"):
        conn = database.connect(self.postgres)
        try:
            return planning.plan_batch(conn, KafkaOffsets(self.kafka), pipeline, run_id=run_id)
        finally:
            conn.close()


def produce_per_partition(kafka: dict, topic: str, partitions: int, per_partition: int, seed: int) -> None:
    """Exactly `per_partition` page views in every partition (keys as sample_data makes them)."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka["bootstrap.servers"], "enable.idempotence": True,
                         "linger.ms": 20, "batch.num.messages": 10_000})
    for i in range(partitions * per_partition):
        key, value = sample_data.page_view(rng)
        sample_data.send(producer, topic, key, json.dumps(value), partition=i % partitions)
    sample_data.flush(producer, topic, 120)


def spans(ranges) -> list[tuple[str, int, int, int]]:
    """A batch's ranges as the plain consumer takes them."""
    return [(r.topic, r.partition, r.from_offset, r.until_offset) for r in ranges]


def topic_partitions(env: Env, topic: str) -> int:
    return len(KafkaOffsets(env.kafka).partitions((topic,)))
