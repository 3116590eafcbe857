"""DAG runs through Airflow itself (`airflow dags test`, `dag.test()`): new records added exactly once
(spark-submit through the provider's operator), and what operators do in the Airflow UI: trigger with
params, clear a committed run (no-op, or `recompute`), and the manual replay DAG.

Clearing is modelled by running the same run id again (tests/airflow/run_dag.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime

import pytest
import sqlalchemy

from kafka_batch_dev import sample_data
from tests.conftest import FAKE_PASSWORD
from tests.integration.helpers import (
    aggregate_table,
    batches_of,
    below,
    count_rows,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    pg_connect,
    positions,
    query,
    records_by_partition,
    run_airflow,
    run_dag,
    table_contents,
    update_pipeline,
)
from tests.integration.statsd_listener import StatsdListener
from tests.integration.test_end_to_end import _produce
from tests.integration.test_operations import DOUBLED

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("dag_runs_alone")]


def test_dag_runs_add_exactly_the_new_records(services):
    pipeline = new_pipeline("e2e", spark_submit=True)
    topic = pipeline.topics[0]
    produced = 0
    poison: set[int] = set()
    for run, count in enumerate((3000, 0, 1700)):
        if count:
            sample_data.produce_page_views(kafka_config(), topic, count, seed=run)
            produced += count
            poison.update(_produce(topic, [b"{not json"], partition=0))  # quarantined, the rest commits
        if run == 0:  # as users test a DAG, through spark-submit (the provider's operator)
            run_airflow("dags", "test", pipeline.dag_id)
            update_pipeline(pipeline.name, connections={"kafka": pipeline.connections.kafka, "postgres":
                            pipeline.connections.postgres, "spark": os.environ["KAFKA_BATCH_TEST_SPARK_CONN"]})
        else:  # the same dag.test() in the tests' DAG-run server, batches on the tests' Spark
            run_dag(pipeline.dag_id, f"2026-01-0{run}T00:00:00+00:00")
        truth = ground_truth(topic, select=lambda p, o: p != 0 or o not in poison)
        assert sum(v for v, _ in truth.values()) == produced
        assert table_contents(pipeline) == truth, f"after run {run}"
        assert query('SELECT "offset" FROM kafka_batch.quarantine WHERE pipeline = %s AND partition = 0'
                     " ORDER BY 1", pipeline.name) == [(o,) for o in sorted(poison)]

    statuses = [b[2] for b in batches_of(pipeline.name)]
    assert statuses == ["committed", "empty", "committed"]
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute("SELECT sum(records_read), sum(records_invalid) FROM kafka_batch.batches WHERE pipeline = %s",
                    (pipeline.name,))
        assert cur.fetchone() == (produced, 2)
    conn.close()

    # The Postgres connection carries a password: it must not reach logs, XCom or rendered fields.
    leaked = subprocess.run(["grep", "-rl", FAKE_PASSWORD, os.environ["AIRFLOW_HOME"]], capture_output=True, text=True)
    assert leaked.stdout == "", f"password found in {leaked.stdout}"
    engine = sqlalchemy.create_engine(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with engine.connect() as db:
        xcoms = db.execute(sqlalchemy.text("SELECT CAST(value AS TEXT) FROM xcom WHERE dag_id = :d"),
                           {"d": pipeline.dag_id}).fetchall()
        rendered = db.execute(
            sqlalchemy.text("SELECT CAST(rendered_fields AS TEXT) FROM rendered_task_instance_fields WHERE dag_id = :d"),
            {"d": pipeline.dag_id},
        ).fetchall()
    engine.dispose()
    assert xcoms and rendered
    assert all(FAKE_PASSWORD not in (row[0] or "") for row in xcoms + rendered)
    assert any("batch_id" in (row[0] or "") for row in xcoms)


def test_params_dry_run_limits_clear_and_recompute(services):
    pipeline = new_pipeline("ui")
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 500, seed=51)

    run_dag(pipeline.dag_id, "2026-01-01T00:00:00+00:00", dry_run=True)
    assert positions(pipeline.name) == {} and batches_of(pipeline.name) == []  # a dry run changes nothing

    run_dag(pipeline.dag_id, "2026-01-02T00:00:00+00:00", max_records_per_batch=90, recompute=True)
    first = positions(pipeline.name)
    assert sum(first.values()) == 90  # the limit of this run only
    run_dag(pipeline.dag_id, "2026-01-03T00:00:00+00:00")
    assert table_contents(pipeline) == ground_truth(topic)
    committed = positions(pipeline.name)

    # Clearing a committed run: same batch, nothing happens, Spark is not started.
    sample_data.produce_page_views(kafka_config(), topic, 100, seed=52)
    run_dag(pipeline.dag_id, "2026-01-03T00:00:00+00:00")
    assert positions(pipeline.name) == committed and table_contents(pipeline) != ground_truth(topic)
    assert len(batches_of(pipeline.name)) == 2

    # Clearing the run that asked for `recompute`, after the aggregation changed: its ranges are replayed.
    update_pipeline(pipeline.name, sinks={"aggregate": {**DOUBLED, "table": aggregate_table(pipeline)}})
    run_dag(pipeline.dag_id, "2026-01-02T00:00:00+00:00", max_records_per_batch=90, recompute=True)  # its conf again
    assert positions(pipeline.name) == committed
    first_batch_records = count_rows(
        "SELECT records_read FROM kafka_batch.batches WHERE pipeline = %s AND run_id LIKE %s",
        pipeline.name, "manual__2026-01-02%recompute__1",
    )
    assert first_batch_records == 90
    assert batches_of(pipeline.name)[-1][1:3] == ("replay", "committed")
    in_first = lambda p, o: o < first[(topic, p)]  # noqa: E731
    assert table_contents(pipeline) == merged(
        ground_truth(topic, select=in_first, duration_factor=2),
        ground_truth(topic, select=lambda p, o: not in_first(p, o) and o < committed[(topic, p)]),
    )


def test_replay_dag_reports_first_then_swaps(services):
    pipeline = new_pipeline("uireplay", partitions=2)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=61)
    run_dag(pipeline.dag_id, "2026-01-01T00:00:00+00:00")
    update_pipeline(pipeline.name, sinks={"aggregate": {**DOUBLED, "table": aggregate_table(pipeline)}})
    before = table_contents(pipeline)

    replay = f"{pipeline.dag_id}__replay"
    run_dag(replay, "2026-01-01T00:00:00+00:00", topic=topic, from_offset=0, until_offset=1, reason="check")
    assert table_contents(pipeline) == before  # a dry run by default: recomputed and previewed only
    assert batches_of(pipeline.name)[-1][1:3] == ("replay", "previewed")
    assert count_rows("SELECT count(*) FROM kafka_batch.replay_previews WHERE batch_id = %s",
                      batches_of(pipeline.name)[-1][0]) > 0

    run_dag(replay, "2026-01-02T00:00:00+00:00", topic=topic, from_time="2020-01-01T00:00:00Z",
         until_time="2100-01-01T00:00:00Z", reason="doubled durations", dry_run=False)
    assert table_contents(pipeline) == ground_truth(topic, duration_factor=2)
    assert [b[1:3] for b in batches_of(pipeline.name)] == [
        ("batch", "committed"), ("replay", "previewed"), ("replay", "committed"),
    ]


def test_runs_planned_by_time_and_backfills_of_committed_intervals(services):
    """Runs read up to their interval's end; a backfill of a committed interval recomputes, never adds."""
    hour = 3_600_000
    h0 = (int(time.time() * 1000) // hour - 4) * hour
    pipeline = new_pipeline("bytime", plan_by="time", schedule="0 * * * *")
    topic = pipeline.topics[0]
    for n in range(3):  # 300 records in each of three hours, 10 s apart
        sample_data.produce_page_views(kafka_config(), topic, 300, seed=70 + n, start_ms=h0 + n * hour, spacing_ms=10_000)
    records = records_by_partition(topic)

    def first_at(moment_ms: int) -> dict[tuple[str, int], int]:
        return {(topic, p): next((o for o, ts in rs if ts >= moment_ms), rs[-1][0] + 1) for p, rs in records.items()}

    def at(moment_ms: int) -> str:
        return datetime.fromtimestamp(moment_ms / 1000, UTC).isoformat()

    run_dag(pipeline.dag_id, at(h0 + hour))  # interval [h0, h0+1h)
    assert positions(pipeline.name) == first_at(h0 + hour)
    assert table_contents(pipeline) == ground_truth(topic, select=below(first_at(h0 + hour)))
    run_dag(pipeline.dag_id, at(h0 + 2 * hour))
    assert positions(pipeline.name) == first_at(h0 + 2 * hour)
    done = table_contents(pipeline)
    assert done == ground_truth(topic, select=below(first_at(h0 + 2 * hour)))

    # A backfill run over the first interval, already committed: recomputed and swapped, totals unchanged.
    run_dag(pipeline.dag_id, at(h0 + hour), run_after=at(h0 + 5 * hour))
    assert batches_of(pipeline.name)[-1][1:3] == ("replay", "committed")
    assert table_contents(pipeline) == done and positions(pipeline.name) == first_at(h0 + 2 * hour)

    # A late record (its timestamp in the first hour, its offset after everything) joins the run whose
    # offsets hold it, and counts in its own minute.
    sample_data.produce_page_views(kafka_config(), topic, 1, seed=79, start_ms=h0 + 60_000)
    run_dag(pipeline.dag_id, at(h0 + 3 * hour))
    assert table_contents(pipeline) == ground_truth(topic)


def test_dag_runs_send_their_metrics_through_airflows_stats(services, monkeypatch):
    """Airflow's own `[metrics]` (StatsD, tags on the line) carry the plan task's lag, before the batch,
    and the report task's counts and lag after it: equal to the ledger's and to the topic's."""
    listener = StatsdListener()
    for key, value in listener.env().items():
        monkeypatch.setenv(key, value)
    try:
        pipeline = new_pipeline("statsd_dag", limits={"max_records_per_batch": 300})
        topic = pipeline.topics[0]
        sample_data.produce_page_views(kafka_config(), topic, 500, seed=64)
        run_dag(pipeline.dag_id, "2026-01-01T00:00:00+00:00")
        points = listener.received()
    finally:
        listener.close()

    ends = {p: records[-1][0] + 1 for p, records in records_by_partition(topic).items()}  # no transactions: the LSO
    stored = positions(pipeline.name)
    lags = [p for p in points if p.name == "kafka_batch.lag.records" and p.tags["pipeline"] == pipeline.name]
    before, after = lags[:len(ends)], lags[len(ends):]  # the plan task's, then the report task's
    assert {int(p.tags["partition"]): p.value for p in before} == ends
    assert {int(p.tags["partition"]): p.value for p in after} == {
        p: end - stored.get((topic, p), 0) for p, end in ends.items()}
    (valid, invalid), = query("SELECT records_read, records_invalid FROM kafka_batch.batches WHERE pipeline = %s",
                              pipeline.name)
    mine = [p for p in points if p.tags.get("pipeline") == pipeline.name and p.tags.get("kind") == "batch"]
    assert [p.value for p in mine if p.name == "kafka_batch.batch.records_read"] == [valid + invalid] == [300]
    assert [p.value for p in mine if p.name == "kafka_batch.batch.committed"] == [1]
    assert {p.tags["phase"] for p in mine if p.name == "kafka_batch.batch.duration"} == {
        "plan", "read", "commit", "execute"}
