"""Apache Kafka's own broker, embedded: its jars from Maven Central and KRaft nodes on loopback.

`install()` resolves the pinned release (KAFKA_VERSION) from Maven Central (kafka_batch_dev.maven_jars)
into `<local home>/kafka-<version>/libs`, once.

`node_command()` and `write_config()` describe one node, broker and controller in one JVM (KRaft's
combined mode), of a cluster of one node (the default) or three (`Node` gives each its ports). Three
nodes are a cluster as production runs one: every node a voter of the controller quorum, internal and
new topics with three replicas and `min.insync.replicas=2`, unclean leader election off, so one node
can be down while reads, transactions and publishes go on. A node's storage is formatted on its first
start (`format_storage`) with the cluster's one id. The processes themselves are started and stopped by
kafka_batch_dev.local_stack, as every other local service.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import uuid
from dataclasses import dataclass
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
JVM_OPTIONS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
               "-Djava.awt.headless=true")
# As in kafka-run-class.sh, the environment's KAFKA_JVM_PERFORMANCE_OPTS replaces them (the tests' nodes:
# tests/conftest.py).
PERFORMANCE_OPTIONS_VARIABLE = "KAFKA_JVM_PERFORMANCE_OPTS"
# One node's heap alone, each of three's: the cluster's JVMs share two cores and the memory with Spark
# Connect, Postgres and Airflow (three 512 MB heaps held 3M-record batches and node kills).
HEAP = {1: ("-Xmx1g", "-Xms256m"), 3: ("-Xmx512m", "-Xms128m")}
SIZES = tuple(HEAP)  # the cluster sizes `kafka-batch local up --kafka-nodes` starts
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


@dataclass(frozen=True)
class Node:
    """One node of the local cluster: its id (1, 2, 3), its client port and its controller port."""

    id: int
    port: int
    controller_port: int


def write_config(directory: Path, node: Node, cluster: list[Node], extra: dict | None = None,
                 listener: str = "PLAINTEXT") -> Path:
    """server.properties of one combined node of `cluster` on loopback, its clients' listener named for its
    protocol (`listener`: PLAINTEXT, or SASL_SSL with kafka_security's settings in `extra`), with `extra`
    settings over ours (and its Log4j 2 configuration); the path, readable by its owner only (a secured
    node's holds passwords)."""
    directory.mkdir(parents=True, exist_ok=True)
    replicas = min(len(cluster), 3)
    in_sync = 2 if replicas >= 3 else 1  # a write is acknowledged by two of three: one node may be down
    settings = {
        "process.roles": "broker,controller",
        "node.id": node.id,
        "controller.quorum.voters": ",".join(f"{n.id}@127.0.0.1:{n.controller_port}" for n in cluster),
        "listeners": f"{listener}://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"{listener}://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": directory / "data",
        # Internal topics as replicated as new ones, with few partitions (each costs start-up time).
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "unclean.leader.election.enable": "false",  # Kafka's default, said: a lagging replica never leads
        # A replica that stops fetching leaves the in-sync set after 10 s (Kafka's default: 30), so a node
        # that hangs holds acks=all writes back for seconds, not half a minute.
        "replica.lag.time.max.ms": 10_000,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
        "group.initial.rebalance.delay.ms": 0,
        # The active controller writes a no-op record to the metadata log every 5 s when nothing changes
        # (Kafka's default: every 0.5 s), which every node then fetches and applies: at the default, an idle
        # node's busiest thread was its raft-io, and side by side an idle node used a third less CPU at 5 s.
        # The tests' and the bench's nodes share two cores with everything else; the no-ops only show
        # that the quorum lives (KIP-835).
        "metadata.max.idle.interval.ms": 5000,
        # What the tests wait for happens within seconds, not Kafka's minutes: the coordinator's look for
        # transactions past their timeout, the cleaner's look for logs to compact, retention's look for
        # segments to delete.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
        "log.cleaner.backoff.ms": 1000,
        "log.retention.check.interval.ms": 1000,
        **(extra or {}),
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
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    return path


def coordinator_partition(key: str, partitions: int = 4) -> int:
    """The partition of `__consumer_offsets` (a group id) or `__transaction_state` (a transactional id) whose
    leader coordinates `key`: Kafka's own rule, abs(String.hashCode()) modulo the topic's partitions (both
    have 4 here: write_config)."""
    h = 0
    utf16 = key.encode("utf-16-be")
    for i in range(0, len(utf16), 2):
        h = (31 * h + int.from_bytes(utf16[i:i + 2], "big")) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if h == -(1 << 31) else abs(h) % partitions


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _java(java_home: str | None) -> str:
    return str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")


def jvm_performance_options() -> tuple[str, ...]:
    """The JVM's performance settings of every Kafka class run here: the environment's, or Kafka's own."""
    configured = os.environ.get(PERFORMANCE_OPTIONS_VARIABLE, "").strip()
    return tuple(shlex.split(configured)) if configured else JVM_OPTIONS


def _jvm_command(home: Path, config: Path, java_home: str | None, heap: tuple[str, ...], main_class: str,
                 *args: str) -> list[str]:
    """A Kafka class run on the broker's jars with `heap` and the performance settings (as
    kafka-run-class.sh runs every class), logging as `config`'s directory says."""
    return [_java(java_home), *heap, *jvm_performance_options(),
            f"-Dlog4j2.configurationFile={config.parent / 'log4j2.properties'}",
            "-cp", classpath(home), main_class, *args]


def node_command(home: Path, config: Path, java_home: str | None, nodes: int = 1) -> list[str]:
    return _jvm_command(home, config, java_home, HEAP[nodes], MAIN_CLASS, str(config))


def formatted(config: Path) -> bool:
    return (config.parent / "data" / "meta.properties").exists()


def format_storage(home: Path, config: Path, java_home: str | None, cluster_id: str | None = None,
                   extra_args: list[str] | None = None) -> None:
    """Format the node's storage once (KRaft needs a cluster id and its metadata log before the first
    start); every node of a cluster with the cluster's one id. `extra_args`: the storage tool's, such as
    the SCRAM users the metadata log starts with (kafka_security)."""
    if formatted(config):
        return
    cluster_id = cluster_id or new_cluster_id()
    # One argument with its option: an id may begin with "-", which would read as an option of its own.
    command = _jvm_command(home, config, java_home, ("-Xmx256m",), STORAGE_TOOL, "format", "--config", str(config),
                           f"--cluster-id={cluster_id}", *(extra_args or ()))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"formatting the Kafka node's storage failed (exit {result.returncode}):\n"
                           f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
