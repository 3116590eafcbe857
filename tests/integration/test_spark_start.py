"""What a Spark process on this machine starts from: Python workers import the installed, compiled
pyspark (kafka_batch.spark.spark_home), not the zipped copy Spark puts first on their path."""

from __future__ import annotations


def _pyspark_file(_) -> str:
    import pyspark

    return pyspark.__file__


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark):
    [where] = spark.sparkContext.parallelize([0], 1).map(_pyspark_file).collect()
    assert ".zip" not in where and where.endswith("pyspark/__init__.py"), where
