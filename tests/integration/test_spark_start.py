"""What a Spark process on this machine starts from: Python workers import the installed, compiled
pyspark (kafka_batch.spark.spark_home), not the zipped copy Spark puts first on their path; spark-submit
knows the batch's size (C1 only for a short one)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kafka_batch import connections
from kafka_batch.config import PROJECT_ROOT
from kafka_batch.core import planning
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch.spark import submit
from kafka_batch_dev import sample_data
from tests.integration.helpers import kafka_config, new_pipeline, store_connection

pytestmark = pytest.mark.integration


def _pyspark_file(_) -> str:
    import pyspark

    return pyspark.__file__


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark):
    [where] = spark.sparkContext.parallelize([0], 1).map(_pyspark_file).collect()
    assert ".zip" not in where and where.endswith("pyspark/__init__.py"), where


def test_spark_submit_learns_the_batch_span_from_postgres_for_its_jvm_options(services):
    pipeline = new_pipeline("span")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 40, seed=3)
    conn = store_connection()
    try:
        batch = planning.plan_batch(conn, KafkaOffsets(kafka_config()), pipeline, run_id="span-1")
    finally:
        conn.close()
    postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
    assert submit.batch_span(postgres, batch.id) == batch.span == 40  # short: C1 only
    assert submit.batch_span(postgres, batch.id + 10**6) is None  # unknown: the job itself says why


# Run in a process of its own (the test's holds a classic Spark session): the daemon the server's Python
# worker was forked from, and where that worker's kafka_batch comes from.
_WORKER_FACTS = """
import json
from kafka_batch import connections
from kafka_batch.spark import connect

def facts(batches):
    import os
    import pyarrow as pa
    import kafka_batch
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        daemon = cmdline.read().replace(b"\\0", b" ").decode()
    for _ in batches:
        yield pa.RecordBatch.from_pylist([{"daemon": daemon, "kafka_batch": kafka_batch.__file__}])

spark = connect.session(connections.from_environment("spark_connect_default"))
[row] = spark.range(1).mapInArrow(facts, "daemon string, kafka_batch string").collect()
print(json.dumps(row.asDict()))
"""


def test_connect_workers_fork_from_the_preloaded_daemon_and_run_the_sessions_package(services):
    """The local server's workers start with the read's libraries imported (kafka_batch_daemon.preloaded),
    and still import kafka_batch from the session's artifact, not from the server's environment: a
    changed package takes effect."""
    result = subprocess.run([sys.executable, "-c", _WORKER_FACTS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert "-m kafka_batch_daemon.preloaded pyspark.worker" in facts["daemon"], facts
    assert not facts["kafka_batch"].startswith(str(PROJECT_ROOT / "plugins")), facts


_UPLOADS = """
import json
from pyspark.sql.connect.client.core import SparkConnectClient
from kafka_batch import connections
from kafka_batch.spark import connect

uploads = []
add_artifacts = SparkConnectClient.add_artifacts
SparkConnectClient.add_artifacts = lambda self, *a, **k: uploads.append(a) or add_artifacts(self, *a, **k)
counts = []
for _ in range(2):
    spark = connect.session(connections.from_environment("spark_connect_default"))
    counts.append(len(uploads))
    [row] = spark.range(1).selectExpr("1 AS one").collect()  # the session works
    marked = spark.conf.get(connect.PACKAGE_ADDED)
    spark.client.close()
print(json.dumps({"uploads": counts, "marked": marked, "session": spark.session_id}))
"""


def test_a_batch_uploads_the_package_only_to_a_session_that_lacks_it(services):
    """The package is added to the shared session by its first batch only (issue 36: no artifact upload
    per batch when nothing changed); the mark is the session id, which is the package's hash, so a
    changed package goes to a session of its own (test_connect_workers_fork_... runs the session's copy)."""
    result = subprocess.run([sys.executable, "-c", _UPLOADS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    first, second = facts["uploads"]
    assert first <= 1 and second == first, facts  # 1 on a new session, 0 on one an earlier test warmed
    assert facts["marked"] == facts["session"], facts


_COLLECT = """
import json
from pyspark.sql.connect.client.core import SparkConnectClient
from kafka_batch import connections
from kafka_batch.sinks.base import collect_arrow
from kafka_batch.spark import connect

analyses = []
analyze = SparkConnectClient._analyze
SparkConnectClient._analyze = lambda self, method, **k: analyses.append(method) or analyze(self, method, **k)
spark = connect.session(connections.from_environment("spark_connect_default"))
result = spark.range(0, 1000, 1, 2).selectExpr(
    "id % 7 AS k", "CAST(id AS DECIMAL(20, 2)) / 3 AS amount", "IF(id % 5 = 0, NULL, CAST(id AS STRING)) AS name",
    "TIMESTAMP '2026-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS at",
).groupBy("k").agg({"amount": "sum", "name": "max", "at": "max"}).orderBy("k")
facts = {}
for name, frame in (("rows", result), ("empty", result.where("k < 0"))):
    before = len(analyses)
    ours = collect_arrow(frame)
    facts[name] = {"analyses": analyses[before:], "equal": ours.equals(frame.toArrow()), "rows": ours.num_rows,
                   "schema": str(ours.schema)}
print(json.dumps(facts))
"""


def test_a_result_comes_back_from_spark_connect_in_one_round_trip_as_toarrow_gives_it(services):
    """collect_arrow runs the plan once and asks for no schema (toArrow's extra analysis of the whole plan
    cost every batch 0.05-0.1 s); its table equals toArrow's, types and nulls, also when empty."""
    result = subprocess.run([sys.executable, "-c", _COLLECT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["rows"]["rows"] == 7 and facts["empty"]["rows"] == 0, facts
    for name in ("rows", "empty"):
        assert facts[name]["analyses"] == [] and facts[name]["equal"], facts
    assert "timestamp[us, tz=UTC]" in facts["rows"]["schema"] and "decimal128" in facts["rows"]["schema"], facts
