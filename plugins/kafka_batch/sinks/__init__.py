"""Where a pipeline's results go. Each module is one kind of sink; SINKS maps the YAML key to it.

A sink's module is its definition (loaded by every Airflow task, which parses the DAG file) and its
work (in the batch's driver and executors): pyarrow, pyarrow.compute and pgpq are imported in the
functions that compute, so loading JSON pipelines imports none of them (tests/dags/test_dag_integrity.py).
"""

from kafka_batch.sinks.aggregate import AggregateSink
from kafka_batch.sinks.base import Sink
from kafka_batch.sinks.kafka import KafkaSink
from kafka_batch.sinks.rows import RowsSink
from kafka_batch.sinks.upsert import UpsertSink

SINKS: dict[str, type[Sink]] = {sink.kind: sink for sink in (AggregateSink, RowsSink, UpsertSink, KafkaSink)}

__all__ = ["SINKS", "AggregateSink", "KafkaSink", "RowsSink", "Sink", "UpsertSink"]
