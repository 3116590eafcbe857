"""A mistake in an expression of a definition is found by Spark's own analyzer before anything is planned:
one line naming the file, the field's path, the name and the close ones, exit 2, nothing stored; on the
pipeline's Spark Connect server, or a local session for a spark-submit pipeline. Fixed, the batch runs,
exact against the topic. A failure Spark meets only at run time (a value a cast refuses) is one line
naming the log that holds the trace, and the batch shows as failed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    ground_truth,
    kafka_config,
    new_pipeline,
    nothing_stored,
    one_line_error,
    query,
    run_cli,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration

TOPIC = "topic"  # a sink's messages need an existing topic only once a batch runs: never here


def _refused(pipeline, *words: str, command: tuple[str, ...] = ("run",), cwd: Path | None = None) -> str:
    result = run_cli(*command, "--pipeline", pipeline.name, check=False, cwd=cwd)
    said = one_line_error(result, 2, f"pipeline {pipeline.name!r} ({pipeline.source})", *words)
    nothing_stored(pipeline)
    return said


# Each place a definition holds an expression, a mistake there, and what the line must say.
MISTAKES = {
    "measure": ({"aggregate": {"measures": {"views": "1", "total_duration_ms": "duration"}}},
                ["sinks.aggregate.measures.total_duration_ms: `duration` is not a field or metadata column",
                 "close: `duration_ms`"]),
    "group key": ({"aggregate": {"group_by": {"page": "pages", "minute": "date_trunc('minute', timestamp)"}}},
                  ["sinks.aggregate.group_by.page: `pages` is not a field", "close: `page`"]),
    "function": ({"aggregate": {"group_by": {"page": "page", "minute": "date_trunk('minute', timestamp)"}}},
                 ["sinks.aggregate.group_by.minute: `date_trunk` in \"date_trunk('minute', timestamp)\" is not a"
                  " Spark SQL function"]),
    "syntax": ({"aggregate": {"measures": {"views": "sum(1", "total_duration_ms": "duration_ms"}}},
               ["sinks.aggregate.measures.views: 'sum(1': syntax error"]),
    "rows column": ({"rows": {"table": "rows", "columns": {"user": "usr_id"}}},
                    ["sinks.rows.columns.user: `usr_id` is not a field", "close: `user_id`"]),
    "upsert key": ({"upsert": {"table": "latest", "key": {"user": "usr"}, "columns": {"page": "page"}}},
                   ["sinks.upsert.key.user: `usr` is not a field", "close: `user_id`"]),
    "version": ({"upsert": {"table": "latest", "key": {"user": "user_id"}, "version": "tiemstamp"}},
                ["sinks.upsert.version: `tiemstamp` is not a field", "close: `timestamp`"]),
    "delete_when": ({"upsert": {"table": "latest", "key": {"user": "user_id"}, "delete_when": "duraton_ms < 0"}},
                    ["sinks.upsert.delete_when: `duraton_ms` in 'duraton_ms < 0' is not a field",
                     "close: `duration_ms`"]),
    "kafka key": ({"kafka": {"topic": TOPIC, "key": "upper(usr)", "value": {"page": "page"}}},
                  ["sinks.kafka.key: `usr` in 'upper(usr)' is not a field"]),
    "kafka value": ({"kafka": {"topic": TOPIC, "key": "user_id", "value": {"page": "pge"}}},
                    ["sinks.kafka.value.page: `pge` is not a field", "close: `page`"]),
    "a cast Spark refuses": ({"aggregate": {"measures": {"views": "array(1)", "total_duration_ms": "duration_ms"}}},
                             ["sinks.aggregate.measures.views: 'array(1)': "]),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_mistake_in_any_expression_is_one_line_before_anything_is_planned(services, mistake):
    sinks, words = MISTAKES[mistake]
    pipeline = new_pipeline("expr", partitions=1)
    definition = pipeline.definition["sinks"]
    for kind, section in sinks.items():
        if kind == "aggregate":
            definition = {**definition, "aggregate": {**definition["aggregate"], **section}}
        else:
            table = {"table": f"{pipeline.name}_{section['table']}"} if "table" in section else {}
            topic = {"topic": f"{pipeline.name}_out"} if "topic" in section else {}
            definition = {**definition, kind: {**section, **table, **topic}}
    pipeline = update_pipeline(pipeline.name, sinks=definition)
    _refused(pipeline, *words)


def test_plan_and_its_dry_run_refuse_a_typo_and_the_fixed_definition_runs_exactly(services):
    pipeline = new_pipeline("exprfix", partitions=2)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=121)
    good = pipeline.definition["sinks"]
    typo = {**good, "aggregate": {**good["aggregate"], "measures": {**good["aggregate"]["measures"],
                                                                     "total_duration_ms": "duration"}}}
    pipeline = update_pipeline(pipeline.name, sinks=typo)
    for command in (("validate",), ("plan", "--dry-run"), ("plan",), ("run",)):
        _refused(pipeline, "sinks.aggregate.measures.total_duration_ms: `duration`", command=command)
    pipeline = update_pipeline(pipeline.name, sinks=good)
    assert "valid; its 4 expressions resolve" in run_cli("validate", "--pipeline", pipeline.name).stdout
    run_cli("run", "--pipeline", pipeline.name)
    assert table_contents(pipeline) == ground_truth(topic)
    # Remembered by what the verdict depends on: its next plans do not ask Spark again.
    from kafka_batch.spark.analysis import analysis_key

    assert query("SELECT count(*) FROM kafka_batch.analyzed_definitions WHERE hash = %s",
                 analysis_key(pipeline)) == [(1,)]


def test_a_spark_submit_pipelines_typo_is_found_by_a_local_session(services, tmp_path):
    pipeline = new_pipeline("exprsubmit", partitions=1, spark_submit=True)
    good = pipeline.definition["sinks"]
    pipeline = update_pipeline(pipeline.name, sinks={**good, "aggregate": {**good["aggregate"], "group_by": {
        **good["aggregate"]["group_by"], "page": "pagee"}}})
    _refused(pipeline, "sinks.aggregate.group_by.page: `pagee` is not a field", "close: `page`", cwd=tmp_path)
    assert not list(tmp_path.iterdir())  # the local session left nothing where the command ran (spark-warehouse/)


def test_a_local_session_that_does_not_start_ends_the_analysis_within_its_bound(services, tmp_path):
    # A JVM that never answers: suspended at its start, waiting for a debugger (pyspark waits for its
    # port without a bound). In a process of its own: a worker's earlier in-process session would be reused.
    import subprocess
    import sys
    import uuid

    import psutil

    marker = f"-Dkafka_batch.test={uuid.uuid4().hex}"
    suspended = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=y,address=127.0.0.1:0 {marker}"
    code = ("from kafka_batch.spark import analysis\nanalysis.LOCAL_START_SECONDS = 5\n"
            "with analysis._session(None):\n    pass\n")
    try:  # its output to a file: the JVM, left suspended, would hold a pipe open
        with open(tmp_path / "analysis.out", "w") as output:
            result = subprocess.run([sys.executable, "-c", code], stdout=output, stderr=output, timeout=120,
                                    env={**os.environ, "SPARK_SUBMIT_OPTS": suspended})
    finally:
        for process in psutil.process_iter(["cmdline"]):
            if marker in " ".join(process.info["cmdline"] or []):
                process.kill()
    said = (tmp_path / "analysis.out").read_text()
    assert result.returncode != 0
    assert "the local Spark session that analyzes the expressions did not start within 5 s" in said, said[-2000:]


@pytest.mark.parametrize("spark_submit", [False, True], ids=["spark-connect", "spark-submit"])
def test_a_failure_spark_meets_at_run_time_is_one_line_naming_its_log_and_a_failed_batch(services, spark_submit):
    # A cast that the analyzer allows and the data refuses (ANSI mode: a page that is no number).
    pipeline = new_pipeline("exprruntime", partitions=1, spark_submit=spark_submit)
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 50, seed=122)
    good = pipeline.definition["sinks"]
    pipeline = update_pipeline(pipeline.name, sinks={**good, "aggregate": {**good["aggregate"], "measures": {
        **good["aggregate"]["measures"], "views": "cast(page AS bigint)"}}})
    result = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert result.returncode not in (0, 2), result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    log = next(word for word in lines[0].replace("(", " ").replace(")", " ").split() if word.endswith(".log"))
    assert "CAST_INVALID_INPUT" in Path(log).read_text(), log
    [(status, error)] = query("SELECT status, error FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name)
    assert status == "failed" and "CAST_INVALID_INPUT" in error, (status, error)
    status_line = json.loads(run_cli("status", "--all", "--json").stdout)["pipelines"]
    [mine] = [line for line in status_line if line["pipeline"] == pipeline.name]
    assert mine["last_batch"]["status"] == "failed" and mine["failed_batches"] == 1, mine
