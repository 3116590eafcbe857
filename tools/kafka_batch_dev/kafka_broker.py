"""Apache Kafka's own broker, embedded: its jars from Maven Central and one KRaft node on loopback.

`install()` resolves the pinned release (KAFKA_VERSION) from Maven Central (kafka_batch_dev.maven_jars)
into `<local home>/kafka-<version>/libs`, once.

`node_command()` and `write_config()` describe one node, broker and controller in one JVM (KRaft's
combined mode), its internal topics set for one node, its storage formatted on first start
(`format_storage`). The process itself is started and stopped by kafka_batch_dev.local_stack, as every
other local service.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from kafka_batch_dev.maven_jars import JarSet

KAFKA_VERSION = "4.4.0"  # docker-compose.yml's apache/kafka image pins the same release
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.25.5"  # the Log4j 2 that kafka_2.13 KAFKA_VERSION depends on
# The broker and what its distribution adds to run: Log4j 2 behind SLF4J (the distribution's libs/).
ARTIFACTS = (
    f"org.apache.kafka:kafka_{SCALA_VERSION}:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
)
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
# Kafka's own start script's JVM settings (kafka-server-start.sh, kafka-run-class.sh) with a smaller
# initial heap: the node shares two cores and the memory with Spark Connect, Postgres and Airflow.
JVM_OPTIONS = ("-Xmx1g", "-Xms256m", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
               "-Djava.awt.headless=true")
NODE_ID = 1
JARS = JarSet(f"Apache Kafka {KAFKA_VERSION}", f"kafka-{KAFKA_VERSION}/libs", ARTIFACTS,
              f"*kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar")  # Ivy prefixes the group to the name


def libs_dir(home: Path) -> Path:
    return JARS.libs(home)


def installed(home: Path) -> bool:
    return JARS.installed(home)


def install(home: Path, java_env: dict[str, str] | None = None) -> Path:
    """The broker's jars in `libs_dir(home)`, resolved once; the directory."""
    return JARS.install(home, java_env)


def classpath(home: Path) -> str:
    return os.pathsep.join(str(jar) for jar in sorted(libs_dir(home).glob("*.jar")))


def write_config(directory: Path, port: int, controller_port: int) -> Path:
    """server.properties of one combined node on loopback (and its Log4j 2 configuration); the path."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": directory / "data",
        # Internal topics for one node: one replica, one in sync, few partitions (each costs start-up time).
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        # What the tests wait for happens within seconds, not Kafka's minutes: the coordinator's look for
        # transactions past their timeout, the cleaner's look for logs to compact, retention's look for
        # segments to delete.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
        "log.cleaner.backoff.ms": 1000,
        "log.retention.check.interval.ms": 1000,
    }
    (directory / "log4j2.properties").write_text(
        "status = warn\n"
        "appender.stdout.type = Console\nappender.stdout.name = STDOUT\n"
        "appender.stdout.layout.type = PatternLayout\nappender.stdout.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
        # Every request and every state change at INFO: noise for a local node.
        "logger.request.name = kafka.request.logger\nlogger.request.level = WARN\n"
        "logger.state.name = state.change.logger\nlogger.state.level = WARN\n")
    path = directory / "server.properties"
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    return path


def _java(java_home: str | None) -> str:
    return str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")


def _jvm_command(home: Path, config: Path, java_home: str | None, options: tuple[str, ...], main_class: str,
                 *args: str) -> list[str]:
    """A Kafka class run on the broker's jars, logging as `config`'s directory says."""
    return [_java(java_home), *options, f"-Dlog4j2.configurationFile={config.parent / 'log4j2.properties'}",
            "-cp", classpath(home), main_class, *args]


def node_command(home: Path, config: Path, java_home: str | None) -> list[str]:
    return _jvm_command(home, config, java_home, JVM_OPTIONS, MAIN_CLASS, str(config))


def format_storage(home: Path, config: Path, java_home: str | None) -> None:
    """Format the node's storage once (KRaft needs a cluster id and its metadata log before the first start)."""
    if (config.parent / "data" / "meta.properties").exists():
        return
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    # One argument with its option: an id may begin with "-", which would read as an option of its own.
    command = _jvm_command(home, config, java_home, ("-Xmx256m",), STORAGE_TOOL, "format", "--config", str(config),
                           f"--cluster-id={cluster_id}")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"formatting the Kafka node's storage failed (exit {result.returncode}):\n"
                           f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
