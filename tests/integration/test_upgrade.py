"""An upgrade keeps a running installation exact. An installation made by an earlier version of the
code, whose schema stopped at an earlier migration, holds positions, ledger rows, aggregate contributions,
an upsert table's history and a Kafka sink's published batches; the current code takes over by the normal
path (its next run applies the pending migrations) and goes on: every sink, checked against the topic
read independently, holds each record exactly once, nothing lost, nothing recounted.

The earlier version is the repository's own history (`git archive`): the commit before the
second-newest migration was added, run from its sources with this environment's dependencies and
through spark-submit, so its driver and executors run its code. A migration Postgres refuses leaves
the schema as it was and is said in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections import Counter
from io import BytesIO
from pathlib import Path

import psycopg2
import pytest

from kafka_batch import connections
from kafka_batch_dev import sample_data
from tests.conftest import ROOT
from tests.integration.helpers import (
    _committed_messages,
    committed_records,
    create_topic,
    ground_truth,
    kafka_config,
    new_pipeline,
    run_cli,
)
from tests.integration.test_end_to_end import _transactional_page_views
from tests.integration.test_metrics import _last_stable_offsets

pytestmark = pytest.mark.integration

MIGRATIONS = sorted(path.name for path in (ROOT / "sql").glob("[0-9][0-9][0-9]_*.sql"))


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, timeout=120).stdout


@pytest.fixture(scope="module")
def earlier_version(tmp_path_factory) -> tuple[Path, list[str]]:
    """The sources of the commit before the second-newest migration was added, and its migrations."""
    if not (ROOT / ".git").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("the upgrade test needs the repository's history (a git clone)")
        pytest.skip("the upgrade test needs the repository's history (a git clone)")
    added = _git("log", "--diff-filter=A", "--format=%H", "-1", "--", f"sql/{MIGRATIONS[-2]}").decode().strip()
    directory = tmp_path_factory.mktemp("earlier")
    with tarfile.open(fileobj=BytesIO(_git("archive", f"{added}^", "plugins", "tools", "spark_jobs", "sql"))) as archive:
        archive.extractall(directory, filter="data")
    # This environment's installed metadata is the current version's: its provider entry point names a
    # module the earlier sources lack, which Airflow's provider discovery (the spark-submit hook) imports.
    # The earlier installation's own metadata named none; a description stands in for it.
    provider = directory / "plugins" / "kafka_batch" / "airflow" / "provider.py"
    if not provider.exists():
        provider.write_text('def get_provider_info():\n    return {"package-name": "kafka-batch", "name": "kafka-batch",'
                            ' "description": "an earlier version", "versions": ["0"]}\n')
    return directory, sorted(path.name for path in (directory / "sql").glob("[0-9][0-9][0-9]_*.sql"))


@pytest.fixture
def database(services):
    """A database of its own in the session's Postgres, prepared as sql/roles.sql prepares one; the
    environment that points the pipeline's connection at it."""
    if os.environ.get("KAFKA_BATCH_TEST_POSTGRES"):
        pytest.skip("needs the embedded Postgres's administrator")
    params = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
    name = f"upgrade_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(**{**params, "user": "postgres"})
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    admin = psycopg2.connect(**{**params, "user": "postgres", "dbname": name})
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute((ROOT / "sql" / "roles.sql").read_text())
    admin.close()
    stored = json.loads(services["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
    yield name, {"AIRFLOW_CONN_KAFKA_BATCH_POSTGRES": json.dumps({**stored, "schema": name})}
    admin = psycopg2.connect(**{**params, "user": "postgres"})
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def _query(database: str, statement: str, *params) -> list[tuple]:
    conn = psycopg2.connect(**{**connections.postgres_params(connections.from_environment("kafka_batch_postgres")),
                               "dbname": database})
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall()
    finally:
        conn.close()


def _run_earlier(sources: Path, env: dict[str, str], *args: str) -> None:
    """`kafka-batch ...` of the earlier version: its sources first on the path, the same dependencies."""
    done = subprocess.run([sys.executable, "-c", "from kafka_batch.cli.commands import console; console()", *args],
                          env={**os.environ, **env, "PYTHONPATH": f"{sources / 'plugins'}:{sources / 'tools'}"},
                          capture_output=True, text=True, timeout=900, cwd=sources)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])


def _latest_per_user(records: list[tuple]) -> dict[str, tuple[str, int]]:
    """The upsert sink's truth: per key its last committed record (a key lives in one partition)."""
    latest: dict[str, tuple[str, int]] = {}
    for _, _, key, value, _ in records:
        record = json.loads(value)
        latest[key.decode()] = (record["page"], record["duration_ms"])
    return latest


def _published_sources(topic: str) -> Counter:
    """How many times each input record was published to the Kafka sink's topic (its source header)."""
    return Counter(dict(message.headers())["kafka_batch.source"].decode()
                   for message in _committed_messages(topic, [0]))


def _check_exact(db: str, pipeline, source: str, output: str) -> None:
    aggregate, upsert = (next(sink.table for sink in pipeline.sinks if sink.kind == kind) for kind in ("aggregate", "upsert"))
    totals = {(page, minute): (views, duration) for page, minute, views, duration in
              _query(db, f"SELECT page, minute, views, total_duration_ms FROM {aggregate}")}
    assert totals == ground_truth(source)
    records = committed_records(source)  # read once, for every check below
    latest = {key: (page, duration) for key, page, duration in _query(db, f"SELECT user_key, page, duration_ms FROM {upsert}")}
    assert latest == _latest_per_user(records)
    published = _published_sources(output)
    assert published == Counter(f"{source}:{p}:{o}" for p, o, _, _, _ in records)
    assert max(published.values()) == 1
    stored = _query(db, "SELECT topic, partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s", pipeline.name)
    assert {(topic, partition): offset for topic, partition, offset in stored} == {
        (source, partition): end for partition, end in _last_stable_offsets(source, [0, 1, 2]).items()}


def test_an_installation_of_an_earlier_version_upgrades_on_its_next_run_and_stays_exact(
        services, earlier_version, database, tmp_path):
    sources, earlier_migrations = earlier_version
    assert set(earlier_migrations) < set(MIGRATIONS), earlier_migrations
    db, env = database
    output = f"upgrade_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 1)
    pipeline = new_pipeline("upgrade", spark_submit=True, sinks={
        "upsert": {"table": "upgrade_latest", "key": {"user_key": "CAST(key AS STRING)"},
                   "columns": {"page": "page", "duration_ms": {"expr": "duration_ms", "type": "bigint"}}},
        "kafka": {"topic": output, "value": {"page": "page"}},
    })
    source = pipeline.topics[0]
    assert sorted(sink.kind for sink in pipeline.sinks) == ["aggregate", "kafka", "upsert"]

    # The earlier version: two batches, into its schema.
    for seed in (1, 2):
        sample_data.produce_page_views(kafka_config(), source, 600, seed=700 + seed, users=50)
        _run_earlier(sources, env, "run", "--pipeline", pipeline.name)
    applied = [v for (v,) in _query(db, "SELECT version FROM public.kafka_batch_migrations ORDER BY 1")]
    assert applied == earlier_migrations
    assert _query(db, "SELECT count(*) FROM kafka_batch.batches WHERE status = 'committed'") == [(2,)]
    _check_exact(db, pipeline, source, output)

    # A migration Postgres refuses: one line, exit 3 (retrying cannot help), and none of the pending ones
    # applied (a migration before it in the same upgrade included).
    refused = tmp_path / "sql"
    shutil.copytree(ROOT / "sql", refused)
    (refused / "999_refused.sql").write_text("CREATE TABLE kafka_batch.upgrade_probe (id int);\n"
                                             "ALTER TABLE kafka_batch.no_such_table ADD COLUMN x int;\n")
    sample_data.produce_page_views(kafka_config(), source, 400, seed=703, users=50)
    said = run_cli("run", "--pipeline", pipeline.name, check=False, env={**env, "KAFKA_BATCH_SQL_DIR": str(refused)})
    assert said.returncode == 3, said.stderr[-3000:]
    pending = [m for m in MIGRATIONS if m not in earlier_migrations]
    assert said.stderr.strip() == (
        f"kafka-batch: refused: migration 999_refused.sql cannot be applied to {db}: relation"
        f' "kafka_batch.no_such_table" does not exist; none of the {len(pending) + 1} pending migrations'
        f" ({pending[0]} to 999_refused.sql) was applied, the schema is as it was"), said.stderr
    assert [v for (v,) in _query(db, "SELECT version FROM public.kafka_batch_migrations ORDER BY 1")] == earlier_migrations
    assert _query(db, "SELECT to_regclass('kafka_batch.upgrade_probe')") == [(None,)]

    # The normal path: the current code's next run applies the pending migrations and reads on, over
    # transactions of two producers, each aborting one in three of its own (4 of 6 committed).
    _transactional_page_views(source, 6, 50, seed=704)
    run_cli("run", "--pipeline", pipeline.name, env=env)
    assert [v for (v,) in _query(db, "SELECT version FROM public.kafka_batch_migrations ORDER BY 1")] == MIGRATIONS
    assert _query(db, "SELECT count(*) FROM kafka_batch.batches WHERE status = 'committed'") == [(3,)]
    _check_exact(db, pipeline, source, output)
