"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    import os

    from pyspark.sql import SparkSession

    from kafka_batch.spark.submit import spark_environment

    for key, value in spark_environment().items():
        os.environ.setdefault(key, value)
    session = (
        SparkSession.builder.master("local[2]").appName("kafka_batch_tests")
        .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false").getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture
def second_cluster(services, tmp_path):
    """Another Apache Kafka node (as `make up` starts one, its data under tmp_path): its bootstrap address."""
    from kafka_batch_dev import local_stack

    state: dict = {}
    local_stack.start_kafka(tmp_path, state)
    try:
        yield f"127.0.0.1:{state['kafka_port']}"
    finally:
        local_stack.stop_kafka(state)
