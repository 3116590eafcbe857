"""How `make bench` starts the peers: the commands, their jars, and the check that a peer's result is the
pipeline's.

- Spark's peers (spark_peer.py) run with the connectors of kafka_batch_dev.spark_connectors: on the local
  Spark Connect server (which has them on its classpath) or through spark-submit with the pipeline's own
  settings (kafka_batch.spark.submit.SPARK_CONF, `local[*]`) and the connectors on `--jars`.
- Kafka Streams (kafka_batch_peers/PageViewStreams.java) on Apache Kafka's kafka-streams.
- Kafka Connect standalone (Apache Kafka's connect-runtime) with Debezium's JDBC sink connector as a
  plugin, configured as connect-standalone.sh and Debezium's documentation do.
Every jar comes from Maven Central once (kafka_batch_dev.maven_jars); the Java sources are compiled here
with the JDK's javac, once per source.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.harness import CHILD_TIMEOUT_S
from kafka_batch.spark.submit import SPARK_CONF, java_home, spark_environment
from kafka_batch_dev import spark_connectors
from kafka_batch_dev.kafka_broker import KAFKA_VERSION, LOG4J_VERSION
from kafka_batch_dev.maven_jars import COMPLETE, JarSet, pyspark_home

HERE = Path(__file__).parent
SPARK_PEER = HERE / "spark_peer.py"
SOURCES = HERE / "kafka_batch_peers"
JACKSON_VERSION = "2.21.7"  # the Jackson Apache Kafka KAFKA_VERSION ships
DEBEZIUM_VERSION = "3.6.0.Final"  # the newest debezium-connector-jdbc on Maven Central
STREAMS = JarSet(f"Kafka Streams {KAFKA_VERSION}", f"kafka-streams-{KAFKA_VERSION}/libs", (
    f"org.apache.kafka:kafka-streams:{KAFKA_VERSION}", f"com.fasterxml.jackson.core:jackson-databind:{JACKSON_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}"), "*kafka-streams-*.jar")
CONNECT_RUNTIME = JarSet(f"Kafka Connect {KAFKA_VERSION}", f"kafka-connect-{KAFKA_VERSION}/libs", (
    f"org.apache.kafka:connect-runtime:{KAFKA_VERSION}", f"org.apache.kafka:connect-json:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}"), "*connect-runtime-*.jar")
DEBEZIUM_JDBC = f"io.debezium:debezium-connector-jdbc:{DEBEZIUM_VERSION}:tar.gz:plugin"
# Flink 2.0, the newest line both its Kafka connector (4.0.1-2.0) and its JDBC connector (4.0.0-2.0) are
# released for; flink-dist is not on Maven Central, so the job runs in the MiniCluster flink-clients starts.
FLINK_VERSION = "2.0.2"
FLINK = JarSet(f"Apache Flink {FLINK_VERSION}", f"flink-{FLINK_VERSION}/libs", (
    f"org.apache.flink:flink-clients:{FLINK_VERSION}", "org.apache.flink:flink-connector-kafka:4.0.1-2.0",
    "org.apache.flink:flink-connector-jdbc-postgres:4.0.0-2.0", "org.postgresql:postgresql:42.7.7",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}"), "*flink-clients-*.jar")


def debezium_plugins(home: Path) -> Path:
    """Debezium's JDBC sink as its documentation installs it: the connector's plugin archive (its jars, the
    JDBC drivers among them) unpacked into a directory of Kafka Connect's `plugin.path`, once; that
    directory. The archive from Maven Central through Maven (the connector's POM names a dependency that
    Central does not hold, so its jars cannot be resolved one by one)."""
    target = home / f"debezium-jdbc-{DEBEZIUM_VERSION}"
    if (target / COMPLETE).exists():
        return target
    with tempfile.TemporaryDirectory(prefix="kafka_batch_debezium_") as work:
        print(f"kafka-batch bench: fetching {DEBEZIUM_JDBC} with Maven", file=sys.stderr)
        result = subprocess.run(["mvn", "-B", "-q", "dependency:copy", f"-Dartifact={DEBEZIUM_JDBC}",
                                 f"-DoutputDirectory={work}"], capture_output=True, text=True,
                                timeout=CHILD_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"Maven could not fetch {DEBEZIUM_JDBC}:\n{result.stdout[-3000:]}")
        shutil.rmtree(target, ignore_errors=True)
        with tarfile.open(next(Path(work).glob("*.tar.gz"))) as archive:
            archive.extractall(target, filter="data")
    (target / COMPLETE).write_text(DEBEZIUM_JDBC + "\n")
    return target


def _jdk(tool: str) -> str:
    """`java` or `javac` of the JDK Spark runs on (kafka_batch.spark.submit.java_home), else PATH's."""
    home = java_home()
    return str(Path(home) / "bin" / tool) if home else (shutil.which(tool) or tool)


def compiled_jar(home: Path, sources: list[Path], classpath: list[Path], name: str) -> Path:
    """`sources` compiled against `classpath` into `<home>/peers/<name>-<hash of the sources>.jar`, once."""
    digest = hashlib.sha256(b"".join(s.read_bytes() for s in sources)).hexdigest()[:12]
    jar = home / "peers" / f"{name}-{digest}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kafka_batch_peers_") as classes:
        cp = ":".join(map(str, classpath))
        result = subprocess.run([_jdk("javac"), "-d", classes, "-cp", cp, *map(str, sources)], capture_output=True, text=True,
                                timeout=CHILD_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"javac of {', '.join(s.name for s in sources)} failed:\n{result.stderr[-3000:]}")
        staging = jar.with_suffix(".tmp")
        shutil.make_archive(str(staging), "zip", classes)
        Path(f"{staging}.zip").rename(jar)
    return jar


def spark_jars(home: Path) -> list[Path]:
    """The connectors, and the KafkaRDD helper compiled against them."""
    connectors = spark_connectors.install(home, spark_environment())
    helper = compiled_jar(home, [SOURCES / "KafkaRddRows.java"], [Path(pyspark_home(), "jars", "*"), *connectors],
                          "kafka-rdd-rows")
    return [*connectors, helper]


def spark_peer_command(home: Path, mode: str, remote: str | None, kafka: dict, postgres: dict,
                       ranges: list[tuple[str, int, int, int]], table: str, **options: str) -> tuple[list[str], dict]:
    """(command, environment) of one Spark peer run: on the Spark Connect server at `remote`, else
    through spark-submit."""
    args = [str(SPARK_PEER), "--mode", mode, "--kafka", json.dumps(kafka), "--postgres", json.dumps(postgres),
            "--ranges", json.dumps(ranges), "--table", table,
            *[arg for key, value in options.items() for arg in (f"--{key}", value)]]
    if remote:
        return [sys.executable, *args, "--remote", remote], {}
    conf = {**SPARK_CONF, "spark.streaming.kafka.allowNonConsecutiveOffsets": "true"}  # transactions' markers
    submit = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[*]",
              "--jars", ",".join(map(str, spark_jars(home))),
              *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]]
    return [*submit, *args], spark_environment()


def streams_command(home: Path, kafka: dict, source: str, output: str, application_id: str, threads: int) -> list[str]:
    """The Kafka Streams application over `source` into `output`, with as many stream threads as the
    input has partitions up to the machine's cores (Kafka Streams' guide: one thread per core)."""
    STREAMS.install(home, spark_environment())
    jars = STREAMS.jars(home)
    app = compiled_jar(home, [SOURCES / "PageViewStreams.java"], jars, "page-view-streams")
    return [_jdk("java"), "-cp", ":".join(map(str, [app, *jars])), "kafka_batch_peers.PageViewStreams",
            kafka["bootstrap.servers"], source, output, application_id, str(threads)]


def flink_command(home: Path, mode: str, kafka: dict, group: str, ranges: list[tuple[str, int, int, int]],
                  target: str, postgres: dict | None = None) -> list[str]:
    """The Flink job (kafka_batch_peers/FlinkPageViews.java) in `mode` (aggregate: into the table `target`;
    publish: to the topic `target`) over `ranges`, in a JVM of its own with Flink's local MiniCluster (the
    machine's cores as its parallelism, Flink's default)."""
    FLINK.install(home, spark_environment())
    jars = FLINK.jars(home)
    app = compiled_jar(home, [SOURCES / "FlinkPageViews.java"], jars, "flink-page-views")
    spans = ",".join(f"{topic}:{partition}:{start}:{until}" for topic, partition, start, until in ranges)
    database = ([f"jdbc:postgresql://{postgres['host']}:{postgres['port']}/{postgres['dbname']}", postgres["user"],
                 postgres.get("password") or ""] if postgres else [])
    return [_jdk("java"), "-cp", ":".join(map(str, [app, *jars])), "kafka_batch_peers.FlinkPageViews", mode,
            kafka["bootstrap.servers"], group, spans, target, *database]


def connect_command(home: Path, work: Path, kafka: dict, postgres: dict, topic: str, table: str,
                    tasks: int) -> list[str]:
    """Kafka Connect standalone (connect-standalone.sh's JVM settings) running Debezium's JDBC sink from
    `topic` (JSON keys and values with their schemas) into `table` (created beforehand): upserts keyed
    by the record key, tombstones deleted. Its settings are those Debezium's documentation gives for
    throughput: batches of 10,000 records (`batch.size` and the consumer's `max.poll.records` together)
    and the reduction buffer (one write per key in a batch)."""
    runtime = CONNECT_RUNTIME.install(home, spark_environment())
    work.mkdir(parents=True, exist_ok=True)
    worker = {
        "bootstrap.servers": kafka["bootstrap.servers"],
        "key.converter": "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable": "true",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "true",
        "offset.storage.file.filename": work / "offsets", "plugin.path": debezium_plugins(home),
        "consumer.max.poll.records": 10_000, "consumer.isolation.level": "read_committed",
        "consumer.auto.offset.reset": "earliest", "listeners": "http://127.0.0.1:0",
    }
    url = f"jdbc:postgresql://{postgres['host']}:{postgres['port']}/{postgres['dbname']}"
    connector = {
        "name": f"jdbc-sink-{table}", "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": tasks, "topics": topic, "connection.url": url, "connection.username": postgres["user"],
        "connection.password": postgres.get("password") or "", "insert.mode": "upsert", "delete.enabled": "true",
        "primary.key.mode": "record_key", "primary.key.fields": "customer_id", "schema.evolution": "none",
        "collection.name.format": table, "batch.size": 10_000, "use.reduction.buffer": "true",
    }
    for name, settings in (("worker", worker), ("connector", connector)):
        (work / f"{name}.properties").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return [_jdk("java"), "-Xms256M", "-Xmx2G", "-cp", f"{runtime}/*", "org.apache.kafka.connect.cli.ConnectStandalone",
            str(work / "worker.properties"), str(work / "connector.properties")]
