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


class KafkaCluster:
    """Three Apache Kafka nodes of a test module's own, as `kafka-batch local up --kafka-nodes 3` starts
    them (replication factor 3, min.insync.replicas 2), their data under `home`; its faults are
    kafka_batch_dev.local_stack's (kill, freeze, revive), and where a partition's leader or a group's
    coordinator is, the cluster's own metadata says."""

    def __init__(self, home):
        from kafka_batch_dev import local_stack

        self.home = home
        self.bootstrap = local_stack.bootstrap_servers(local_stack.read_state(home))
        self.config = {"bootstrap.servers": self.bootstrap}

    def connection(self) -> str:
        import json

        return json.dumps({"conn_type": "kafka", "extra": self.config})

    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.config)

    def _partition(self, topic: str, partition: int, timeout: float = 30):
        """The partition's metadata, asked again while the node that answers does not know it yet (one just
        revived answers from its metadata before it caught up with the controller's)."""
        from kafka_batch_dev.chaos.harness import until

        admin = self._admin()
        known = until(lambda: admin.list_topics(topic, timeout=30).topics[topic].partitions.get(partition), timeout)
        assert known is not None, f"no node knew {topic}[{partition}] within {timeout:g} s"
        return known

    def leader(self, topic: str, partition: int) -> int:
        return self._partition(topic, partition).leader

    def in_sync(self, topic: str, partition: int) -> list[int]:
        return sorted(self._partition(topic, partition).isrs)

    def warm(self) -> None:
        """The internal topics exist (the first group offset and the first transactional producer make them)
        and each partition is led by its preferred node again (kills leave every leader on the survivors)."""
        import time

        from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition

        from kafka_batch.kafka.publish import COORDINATOR_MOVED
        from kafka_batch_dev import sample_data

        producer = Producer({**self.config, "transactional.id": "kafka-batch-tests.warm"})
        producer.init_transactions(60)
        producer.close()
        group = Consumer({**self.config, "group.id": "kafka-batch-tests.warm", "enable.auto.commit": False})
        sample_data.ensure_topic(self.config, "kafka_batch_tests_warm", 1)
        deadline = time.monotonic() + 60
        while True:  # a coordinator just elected answers COORDINATOR_LOAD_IN_PROGRESS until it has read its log
            try:
                group.commit(offsets=[TopicPartition("kafka_batch_tests_warm", 0, 0)], asynchronous=False)
                break
            except KafkaException as exc:
                if exc.args[0].code() not in COORDINATOR_MOVED or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        group.close()
        admin = self._admin()
        internal = [TopicPartition(topic, p) for topic in ("__consumer_offsets", "__transaction_state") for p in range(4)]
        try:  # its keyword arguments fail in confluent-kafka 2.16's binding (SystemError)
            admin.elect_leaders(ElectionType.PREFERRED, internal).result(timeout=60)
        except KafkaException:  # ELECTION_NOT_NEEDED: each led by its preferred node already
            pass

    def group_leader(self, group: str) -> int:
        """The node that coordinates `group` once it exists: the leader of its partition of __consumer_offsets."""
        from kafka_batch_dev.kafka_broker import coordinator_partition

        return self.leader("__consumer_offsets", coordinator_partition(group))

    def group_coordinator(self, group: str) -> int:
        import time

        from confluent_kafka import KafkaException

        admin = self._admin()  # referenced until its answer: a destroyed client never completes its futures
        deadline = time.monotonic() + 60
        while True:  # a fresh cluster's coordinators are still loading
            try:
                return admin.describe_consumer_groups([group], request_timeout=10)[group].result(
                    timeout=15).coordinator.id
            except (KafkaException, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def transaction_coordinator(self, transactional_id: str) -> int:
        from kafka_batch_dev.kafka_broker import coordinator_partition

        return self.leader("__transaction_state", coordinator_partition(transactional_id))

    def active_controller(self) -> int:
        """The node leading the controllers' quorum (-1: none elected within a minute)."""
        from kafka_batch_dev import local_stack

        return local_stack.active_controller(self.home)

    def kill(self, node: int) -> None:
        from kafka_batch_dev import local_stack

        local_stack.kill_kafka_node(self.home, node)

    def freeze(self, node: int, frozen: bool = True) -> None:
        from kafka_batch_dev import local_stack

        local_stack.freeze_kafka_node(self.home, node, frozen)

    def thaw(self) -> None:
        """Every frozen node goes on (SIGCONT to a running one changes nothing)."""
        from kafka_batch_dev import local_stack

        for node in local_stack.kafka_node_pids(local_stack.read_state(self.home)):
            local_stack.freeze_kafka_node(self.home, node, frozen=False)

    def revive(self, only: set[int] | None = None) -> None:
        """Every node that is down (or of `only`) starts again on its data; every frozen one goes on."""
        from kafka_batch_dev import local_stack

        self.thaw()
        local_stack.revive_kafka(self.home, only)


@pytest.fixture
def on_cluster(kafka_cluster, monkeypatch):
    """The test's pipelines, topics and ground truth on the module's three-node cluster."""
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_cluster.connection())
    yield kafka_cluster
    kafka_cluster.revive()


# How long a node that stopped answering stays registered: 30 s (Kafka's default broker.session.timeout.ms is
# 9 s). A frozen node then stays registered as a host whose heartbeats stall: the commit's coordinator lookup
# still names it, and librdkafka's send_offsets_to_transaction waits past its own timeout there
# (confluentinc/librdkafka#5456). The node kills have run with it the longest: 9 s moved leaderships sooner,
# and two of their CI runs met retriable windows that the code now waits out.
BROKER_SESSION_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def kafka_cluster(services, tmp_path_factory):
    """A three-node cluster for one test module, test_failover.py's (the session's broker serves the other
    tests meanwhile); each test leaves every node running for the next (on_cluster)."""
    import json

    from kafka_batch_dev import local_stack

    home = tmp_path_factory.mktemp("kafka_cluster")
    state: dict = {}
    try:
        local_stack.start_kafka(home, state, nodes=3, settings={"broker.session.timeout.ms": BROKER_SESSION_TIMEOUT_MS})
        (home / "state.json").write_text(json.dumps(state))
        cluster = KafkaCluster(home)
        yield cluster
        cluster.thaw()
    finally:
        left = local_stack.stop_kafka(local_stack.read_state(home) or state)
        assert not left, f"Kafka nodes survived: {left}"


class SecuredKafka:
    """One Apache Kafka node as `kafka-batch local up --kafka-security sasl_ssl` starts it: SASL_SSL with
    SCRAM-SHA-512, a local CA, KRaft's StandardAuthorizer (no ACL, no access). `admin` is its super user."""

    def __init__(self, home):
        from kafka_batch_dev import local_stack

        self.home = home
        state = local_stack.read_state(home)
        self.admin = local_stack.kafka_admin_config(home, state)
        self.secured = local_stack.kafka_secured(home, state)

    def add_user(self, user: str, password: str) -> None:
        from kafka_batch_dev import kafka_security

        kafka_security.add_user(self.admin, user, password)

    def connection(self, user: str | None = None, password: str | None = None) -> str:
        """A Kafka connection as an operator stores it (the provider's form: login, password, extra), of the
        admin, or of `user`."""
        from kafka_batch_dev import kafka_security

        return kafka_security.connection(
            kafka_security.client_config(self.secured, self.admin["bootstrap.servers"], user or "admin", password))


@pytest.fixture(scope="module")
def secured_kafka(services, tmp_path_factory):
    """A secured one-node cluster for one test module, its home under the session's directory (whose every
    file the session's end scans for the planted password)."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from kafka_batch_dev import local_stack

    base = Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]).parent
    home = Path(tempfile.mkdtemp(prefix="secured_kafka_", dir=base))
    state: dict = {}
    try:
        local_stack.start_kafka(home, state, nodes=1, security="sasl_ssl")
        (home / "state.json").write_text(json.dumps(state))
        yield SecuredKafka(home)
    finally:
        left = local_stack.stop_kafka(local_stack.read_state(home) or state)
        assert not left, f"Kafka node survived: {left}"
