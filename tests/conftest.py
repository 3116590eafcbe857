"""Shared fixtures. Integration tests use real services: the embedded ones by default, or a real
Kafka and Postgres given by address:

    KAFKA_BATCH_TEST_BOOTSTRAP=host:9092            (librdkafka settings: KAFKA_BATCH_TEST_KAFKA_CONFIG='{json}')
    KAFKA_BATCH_TEST_POSTGRES=postgresql://user:pass@host:5432/db
    KAFKA_BATCH_TEST_SCHEMA_REGISTRY=http://user:pass@host:8081   (else the local one runs beside them)
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
# py4j says at INFO that its gateway closes, at interpreter exit, after pytest has closed the stream its
# log handler wrote to: a "--- Logging error ---" at the end of the run, about nothing.
logging.getLogger("py4j").setLevel(logging.WARNING)
# In-process Airflow (DagBag, Connection parsing) gets a throwaway home, never ~/airflow; the process that
# made it (xdist's controller: its workers inherit the variable) removes it at exit.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="kafka_batch_airflow_home_")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# The tests' JVMs serve small loads for seconds or minutes: the Kafka nodes (the session's, the clusters and
# nodes of single tests), the Spark Connect servers, the spark-submit drivers and the `spark` fixture's.
# C1-compiled code and the serial collector cost them less CPU than C2 and G1 on two cores, side by side:
# a Kafka node's start 2.9-3.1 instead of 4.9-5.1 CPU s and 200,000 records produced and read 1.8 instead
# of 3.0-3.2; a Spark Connect server's start 5.8-7.1 instead of 10.5-11.0 and 24 batches of 2,000
# records 19.6-23.3 instead of 32.9-37.9 (three pairs); a spark-submit batch of 1,000 records took 22-23 s
# instead of 26-27 s. Users' JVMs keep the defaults. Set here, before the services start, so that every
# process of the session inherits them.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
os.environ.setdefault("KAFKA_JVM_PERFORMANCE_OPTS", f"-server {TEST_JVM_OPTIONS} -Djava.awt.headless=true")
# A password the tests look for in logs and XCom. The local Postgres trusts loopback, so it is unused.
# xdist workers inherit the controller's environment, so every process plants and looks for the same one.
FAKE_PASSWORD = os.environ.setdefault("KAFKA_BATCH_TEST_FAKE_PASSWORD", "s3cret-" + uuid.uuid4().hex[:12])
SHARED_SERVICES = "kafka_batch_services"


def _external_env(base: Path) -> dict[str, str] | None:
    bootstrap = os.environ.get("KAFKA_BATCH_TEST_BOOTSTRAP")
    postgres = os.environ.get("KAFKA_BATCH_TEST_POSTGRES")
    if not (bootstrap and postgres):
        return None
    from kafka_batch.connections import parse_connection

    pg = parse_connection("kafka_batch_postgres", postgres)
    kafka = {"bootstrap.servers": bootstrap, **json.loads(os.environ.get("KAFKA_BATCH_TEST_KAFKA_CONFIG", "{}"))}
    return {
        "AIRFLOW_HOME": str(base / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{base / 'airflow' / 'airflow.db'}",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka}),
        "AIRFLOW_CONN_KAFKA_BATCH_POSTGRES": pg.to_json(),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
    }


def _schema_registry(base: Path) -> str:
    """The AIRFLOW_CONN_* value of a real Schema Registry given by address, or of the local one started
    beside services given by address (recorded in `base`'s state, so `down` stops it)."""
    from kafka_batch_dev import local_stack

    url = os.environ.get("KAFKA_BATCH_TEST_SCHEMA_REGISTRY")
    if not url:
        state: dict = {}
        local_stack.start_schema_registry(base, state)
        (base / "state.json").write_text(json.dumps(state))
        url = f"http://127.0.0.1:{state['schema_registry_port']}"
    return local_stack.schema_registry_connection(url)


def _start_services() -> tuple[Path, dict[str, str], bool]:
    """(directory, environment, whether embedded services were started) for a test session."""
    from kafka_batch_dev import local_stack

    base = Path(tempfile.mkdtemp(prefix="kafka_batch_test_"))
    base.chmod(0o755)
    pipelines = base / "pipelines"
    pipelines.mkdir()
    env = _external_env(base)
    started = env is None
    if started:
        env = local_stack.up(base, spark_connect=True)  # checks the broker's transactional answers too
        postgres = json.loads(env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
        env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"] = json.dumps({**postgres, "password": FAKE_PASSWORD})
    else:
        env["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"] = _schema_registry(base)
        (base / "airflow").mkdir()
        local_stack.migrate_airflow(base, env)
        local_stack.check_kafka(env)  # as `local up` does for its broker: the cluster's verdict is recorded
    env["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines)
    # How test pipelines reach Spark unless a test says otherwise (helpers.new_pipeline): a Spark Connect
    # server started once, or spark-submit (against services given by address).
    env["KAFKA_BATCH_TEST_SPARK_CONN"] = "spark_connect_default" if started else "spark_default"
    env["KAFKA_BATCH_LOG_DIR"] = str(base / "cli-logs")  # the CLI's Spark logs and outputs (helpers.run_cli)
    env["SPARK_SUBMIT_OPTS"] = os.environ["SPARK_SUBMIT_OPTS"]  # the installed wheel's runs too (test_distribution)
    # The spark-submit JVMs' class archive (kafka_batch.spark.jvm_archive): the session's first batch
    # through spark-submit writes it, later ones map it; never the user's ~/.cache.
    env["KAFKA_BATCH_JVM_ARCHIVE_DIR"] = str(base / "jvm-archive")
    return base, env, started


def _stop_services(base: Path) -> None:
    """Stop what _start_services started, after checking that no log of the session holds the password."""
    from kafka_batch_dev import local_stack

    started = time.monotonic()
    try:
        # Every log of the session (Airflow task and component logs, Spark's logs of the CLI runs, the
        # CLI's outputs, the services' logs and data) must be free of the planted password.
        leaked = [str(path.relative_to(base)) for path in _files(base) if FAKE_PASSWORD.encode() in _contents(path)]
        assert not leaked, f"the planted password is in {leaked}"
    finally:
        scanned = time.monotonic()
        local_stack.down(base)  # what was started: the embedded services, or the local Schema Registry
        shutil.rmtree(base, ignore_errors=True)
        print(f"\nsession teardown: logs and data checked for the planted password in {scanned - started:.1f} s,"
              f" services stopped and removed in {time.monotonic() - scanned:.1f} s")


# Under pytest-xdist (`make test` runs three workers) the controller starts the services once, before the
# workers, hands their environment to every worker and stops them after the last test.
_SHARED: dict = {}
_SESSION_CLOCK = pytest.StashKey[tuple]()


# The test files that use the `spark` fixture: one worker runs them, so the session starts one local
# SparkSession's JVM, not one on each worker (pytest_collection_modifyitems keeps the list whole).
LOCAL_SPARK = ("tests/integration/test_reader.py", "tests/integration/test_spark_start.py",
               "tests/integration/test_fencing.py", "tests/integration/test_json_fields.py",
               "tests/integration/test_transform.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Test files spread over the workers, except those under tests/airflow: they run DAGs on the shared
    Airflow metadata database, so one worker runs them one after the other; and those of LOCAL_SPARK."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/airflow/"):
                return "tests/airflow"
            return "local spark" if path in LOCAL_SPARK else path

    config.option.loadscopereorder = False  # in collection order (below), not by number of tests
    return Scheduling(config, log)


# The units of work that take longest, longest first: the workers take units in collection order, so the
# last ones to start are short and no worker waits long for the others at the end. Files not listed follow
# in their usual order. The seconds are one `make test` run's on two cores (2026-11-30); the machine's
# speed scales them all, their order holds.
LONGEST_FIRST = (
    "tests/airflow/",  # 980 s: the DAG runs, the console and a backfill, one after the other on one worker
    "tests/integration/test_failover.py",  # 330 s: a three-node cluster of its own (its node kills: make chaos)
    "tests/integration/test_chaos.py",  # 320 s: a zombie's two spark-submit JVMs among its faults
    "tests/integration/test_distribution.py",  # 300 s: a wheel installed into a fresh virtualenv
    "tests/integration/test_kafka_sink.py",  # 280 s
    "tests/integration/test_standalone.py",  # 220 s: a Spark standalone cluster
    "tests/integration/test_upgrade.py",  # 160 s: an earlier version's batches through spark-submit, then ours
    "tests/integration/test_kafka_changelog.py",
    "tests/integration/test_many_partitions.py",
    "tests/integration/test_upsert.py",
    "tests/integration/test_expressions.py",  # Spark's analyzer, a local session too
    "tests/integration/test_end_to_end.py",
    "tests/integration/test_kafka_security.py",  # a secured node of its own
    "tests/local/test_local_stack.py",
    "tests/integration/test_avro.py",
    "tests/integration/test_operations.py",
    "tests/integration/test_retention.py",
    "tests/integration/test_metrics.py",
    "tests/integration/test_reader.py",
    "tests/integration/test_connect_session.py",  # a Spark Connect server of its own
    "tests/integration/test_concurrent.py",
    "tests/integration/test_compaction.py",
    "tests/integration/test_getting_started.py",
)


def pytest_collection_modifyitems(config, items):
    unlisted = sorted({item.nodeid.split("::", 1)[0] for item in items if "spark" in getattr(item, "fixturenames", ())}
                      - set(LOCAL_SPARK))
    if unlisted:
        raise pytest.UsageError(f"{', '.join(unlisted)} use the `spark` fixture: add them to LOCAL_SPARK (tests/conftest.py)")

    def rank(item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: tests keep their order within a file


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    if not _SHARED:
        _SHARED["base"], _SHARED["env"], _SHARED["started"] = _start_services()
    node.workerinput[SHARED_SERVICES] = json.dumps(_SHARED["env"])


def _machine_cpu() -> tuple[float, float, float]:
    """Seconds since boot the machine's cores computed, had stolen by the hypervisor, and in all (psutil's
    system-wide times; guest time is already in user, and a field the platform lacks counts 0)."""
    times = psutil.cpu_times()._asdict()
    busy = sum(times.get(field, 0.0) for field in ("user", "nice", "system", "irq", "softirq"))
    stolen = times.get("steal", 0.0)
    return busy, stolen, busy + stolen + times["idle"] + times.get("iowait", 0.0)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_SESSION_CLOCK] = time.monotonic(), _machine_cpu()


def pytest_unconfigure(config):
    if _SHARED:
        _stop_services(_SHARED["base"])
    if _SESSION_CLOCK in config.stash:
        # The suite's time is as much the machine's as the tests': said beside how busy its cores were.
        started, cpu_before = config.stash[_SESSION_CLOCK]
        cpu_after, seconds = _machine_cpu(), time.monotonic() - started
        if seconds > 60:
            busy, stolen, total = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
            print(f"session: {seconds:.0f} s; the machine's {os.cpu_count()} cores computed {busy / total:.0%} of it"
                  f" ({busy:.0f} CPU s), {stolen / total:.0%} stolen by the hypervisor")


@pytest.fixture(scope="session")
def services(request):
    """Environment of running services: the ones the xdist controller shares, or started here and
    stopped at the end."""
    shared = getattr(request.config, "workerinput", {}).get(SHARED_SERVICES)
    if shared:
        env, base, started = json.loads(shared), None, False
    else:
        base, env, started = _start_services()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if base is not None:
            _stop_services(base)


def _contents(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # removed since it was listed (Kafka deletes a topic's files in the background)
        return b""


# Kafka's offset and time indexes: fixed-size entries of offsets and timestamps, preallocated (10 MB each
# per partition, mostly zeros); a record's bytes are in its segment's .log file, which is read.
_INDEXES = (".index", ".timeindex")


def _files(base: Path):
    # os.walk, not rglob: a directory a service removes while it is listed (Kafka deletes a topic's
    # directory in the background) is skipped, where rglob's scandir raised and ended the session in error.
    for root, _, names in os.walk(base):
        for name in names:
            if name.endswith(_INDEXES):
                continue
            path = Path(root, name)
            try:
                if path.is_file() and not path.is_symlink():
                    yield path
            except OSError:  # a file a service removed meanwhile
                continue
