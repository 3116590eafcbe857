"""Which resolved jars the Spark connectors keep: those pyspark does not ship, named by Maven or by Ivy."""

from pathlib import Path

import pytest

from kafka_batch_dev.spark_connectors import _artifact


@pytest.mark.parametrize("jar, artifact", [
    ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),  # Maven: artifact-version
    ("org.apache.spark_spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),  # Ivy: group_artifact-version
    ("kafka-clients-3.9.2.jar", "kafka-clients"),
    ("org.apache.kafka_kafka-clients-3.9.2.jar", "kafka-clients"),
    ("com.github.luben_zstd-jni-1.5.7-7.jar", "zstd-jni"),  # a version with a dash
    ("scala-library-2.13.15.jar", "scala-library"),
    ("kafka_2.13-4.4.0.jar", "kafka_2.13"),
])
def test_a_jar_is_known_by_its_artifact_whatever_its_version_and_resolver(jar, artifact):
    assert _artifact(Path(jar)) == artifact
