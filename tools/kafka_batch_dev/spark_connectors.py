"""Spark's own Kafka connectors, for the peers `make bench` runs the pipeline against.

Spark's Kafka source (spark-sql-kafka-0-10: `spark.read.format("kafka")` and Structured Streaming), the
original KafkaRDD (spark-streaming-kafka-0-10: `KafkaUtils.createRDD`) and `from_avro` (spark-avro), of
the installed pyspark's release, resolved from Maven Central once into the local home
(kafka_batch_dev.maven_jars). Spark's guide adds them with `--packages`; resolved once instead, a
spark-submit takes them with `--jars` and pays no resolution per batch. The local Spark Connect server
starts with them (local_stack.start_spark_connect).
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from kafka_batch_dev.maven_jars import JarSet, pyspark_home

SPARK_VERSION = version("pyspark")  # the connectors must be of the installed Spark's release
ARTIFACTS = tuple(f"org.apache.spark:{name}_2.13:{SPARK_VERSION}"
                  for name in ("spark-sql-kafka-0-10", "spark-streaming-kafka-0-10", "spark-avro"))
JARS = JarSet(f"Spark's Kafka connectors {SPARK_VERSION}", f"spark-kafka-{SPARK_VERSION}/libs", ARTIFACTS,
              "*spark-sql-kafka-0-10_2.13-*.jar")


def _artifact(jar: Path) -> str:
    """A jar's artifact name without its version (Ivy's names start with the group, Maven's do not)."""
    group, underscore, rest = jar.name.partition("_")
    name = rest if underscore and "." in group and "-" not in group else jar.name
    stem = name.removesuffix(".jar")
    scala = stem.rfind("_") + 1  # the version follows a Scala suffix (`_2.13`), if there is one
    version = re.search(r"-\d", stem[scala:])
    return stem[:scala + version.start()] if version else stem


def install(home: Path, java_env: dict[str, str] | None = None) -> list[Path]:
    """The connectors and the dependencies pyspark does not ship (kafka-clients, commons-pool2); their jars."""
    if not JARS.installed(home):  # each Spark Connect start asks: pyspark's jars are listed only to install
        shipped = {_artifact(jar) for jar in Path(pyspark_home(), "jars").glob("*.jar")}
        JARS.install(home, java_env, keep=lambda jar: _artifact(jar) not in shipped)
    return JARS.jars(home)
