"""Shared fixtures. Integration tests use real services: the embedded ones by default, or a real
Kafka and Postgres given by address:

    KAFKA_BATCH_TEST_BOOTSTRAP=host:9092            (librdkafka settings: KAFKA_BATCH_TEST_KAFKA_CONFIG='{json}')
    KAFKA_BATCH_TEST_POSTGRES=postgresql://user:pass@host:5432/db
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# In-process Airflow (DagBag, Connection parsing) gets a throwaway home, never ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="kafka_batch_airflow_home_"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# A password the tests look for in logs and XCom. The local Postgres trusts loopback, so it is unused.
FAKE_PASSWORD = "s3cret-" + uuid.uuid4().hex[:12]


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
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{base / 'airflow' / 'airflow.db'}",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka}),
        "AIRFLOW_CONN_KAFKA_BATCH_POSTGRES": pg.to_json(),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
    }


@pytest.fixture(scope="session")
def services():
    """Environment of running services; embedded ones are started here and stopped at the end."""
    from kafka_batch_dev import local_stack

    base = Path(tempfile.mkdtemp(prefix="kafka_batch_test_"))
    base.chmod(0o755)
    pipelines = base / "pipelines"
    pipelines.mkdir()
    env = _external_env(base)
    started = env is None
    if started:
        env = local_stack.up(base, spark_connect=True)
        postgres = json.loads(env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
        env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"] = json.dumps({**postgres, "password": FAKE_PASSWORD})
    else:
        (base / "airflow").mkdir()
        local_stack.migrate_airflow(base, env)
    env["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines)
    # How test pipelines reach Spark unless a test says otherwise (helpers.new_pipeline): a Spark Connect
    # server started once, or spark-submit (against services given by address).
    env["KAFKA_BATCH_TEST_SPARK_CONN"] = "spark_connect_default" if started else "spark_default"
    env["KAFKA_BATCH_LOG_DIR"] = str(base / "cli-logs")  # the CLI's Spark logs and outputs (helpers.run_cli)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
        # Every log of the session (Airflow task and component logs, Spark's logs of the CLI runs, the
        # CLI's outputs, the services' logs and data) must be free of the planted password.
        leaked = [str(path.relative_to(base)) for path in _files(base) if FAKE_PASSWORD.encode() in path.read_bytes()]
        assert not leaked, f"the planted password is in {leaked}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if started:
            local_stack.down(base)
        shutil.rmtree(base, ignore_errors=True)


def _files(base: Path):
    for path in base.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                yield path
        except OSError:  # a file a service removed meanwhile
            continue
