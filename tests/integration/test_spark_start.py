"""What a Spark process on this machine starts from: Python workers import the installed, compiled
pyspark (kafka_batch.spark.spark_home), not the zipped copy Spark puts first on their path; spark-submit
knows the batch's size (C1 only for a short one)."""

from __future__ import annotations

import pytest

from kafka_batch import connections
from kafka_batch.core import planning
from kafka_batch.kafka_source import KafkaOffsets
from kafka_batch.spark import submit
from kafka_batch_dev import sample_data
from tests.integration.helpers import kafka_config, new_pipeline, store_connection

pytestmark = pytest.mark.integration


def _pyspark_file(_) -> str:
    import pyspark

    return pyspark.__file__


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark):
    [where] = spark.sparkContext.parallelize([0], 1).map(_pyspark_file).collect()
    assert ".zip" not in where and where.endswith("pyspark/__init__.py"), where


def test_spark_submit_learns_the_batch_span_from_postgres_for_its_jvm_options(services):
    pipeline = new_pipeline("span")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 40, seed=3)
    conn = store_connection()
    try:
        batch = planning.plan_batch(conn, KafkaOffsets(kafka_config()), pipeline, run_id="span-1")
    finally:
        conn.close()
    postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
    assert submit.batch_span(postgres, batch.id) == batch.span == 40  # short: C1 only
    assert submit.batch_span(postgres, batch.id + 10**6) is None  # unknown: the job itself says why
