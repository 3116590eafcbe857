"""What operators do in the Airflow UI, through Airflow itself (`dag.test()`): trigger with params,
clear a committed run (no-op, or `recompute`), and the manual replay DAG.

Clearing is modelled by running the same run id again (tests/integration/run_dag.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kafka_batch import sample_data
from tests.integration.helpers import (
    ROOT,
    count_rows,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    positions,
    table_contents,
    update_pipeline,
)
from tests.integration.test_operations import DOUBLED

pytestmark = pytest.mark.integration


def _run(dag_id: str, logical_date: str, **conf) -> None:
    args = [sys.executable, "-m", "tests.integration.run_dag", dag_id, logical_date, json.dumps(conf)]
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=os.environ.copy())
    assert result.returncode == 0, f"{dag_id} {logical_date} {conf}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _batches(pipeline_name: str) -> list[tuple]:
    from tests.integration.helpers import pg_connect

    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute("SELECT kind, status, run_id FROM kafka_batch.batches WHERE pipeline = %s ORDER BY id", (pipeline_name,))
        rows = cur.fetchall()
    conn.close()
    return rows


def test_params_dry_run_limits_clear_and_recompute(services):
    pipeline = new_pipeline("ui")
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 500, seed=51)

    _run(pipeline.dag_id, "2026-01-01T00:00:00+00:00", dry_run=True)
    assert positions(pipeline.name) == {} and _batches(pipeline.name) == []  # a dry run changes nothing

    _run(pipeline.dag_id, "2026-01-02T00:00:00+00:00", max_records_per_batch=90, recompute=True)
    first = positions(pipeline.name)
    assert sum(first.values()) == 90  # the limit of this run only
    _run(pipeline.dag_id, "2026-01-03T00:00:00+00:00")
    assert table_contents(pipeline.table) == ground_truth(topic)
    committed = positions(pipeline.name)

    # Clearing a committed run: same batch, nothing happens, Spark is not started.
    sample_data.produce_page_views(kafka_config(), topic, 100, seed=52)
    _run(pipeline.dag_id, "2026-01-03T00:00:00+00:00")
    assert positions(pipeline.name) == committed and table_contents(pipeline.table) != ground_truth(topic)
    assert len(_batches(pipeline.name)) == 2

    # Clearing the run that asked for `recompute`, after the aggregation changed: its ranges are replayed.
    update_pipeline(pipeline.name, aggregation={**DOUBLED, "table": pipeline.table})
    _run(pipeline.dag_id, "2026-01-02T00:00:00+00:00", max_records_per_batch=90, recompute=True)  # its conf again
    assert positions(pipeline.name) == committed
    first_batch_records = count_rows(
        "SELECT records_read FROM kafka_batch.batches WHERE pipeline = %s AND run_id LIKE %s",
        pipeline.name, "manual__2026-01-02%recompute__1",
    )
    assert first_batch_records == 90
    assert _batches(pipeline.name)[-1][:2] == ("replay", "committed")
    in_first = lambda p, o: o < first[(topic, p)]  # noqa: E731
    assert table_contents(pipeline.table) == merged(
        ground_truth(topic, select=in_first, duration_factor=2),
        ground_truth(topic, select=lambda p, o: not in_first(p, o) and o < committed[(topic, p)]),
    )


def test_replay_dag_reports_first_then_swaps(services):
    pipeline = new_pipeline("uireplay", partitions=2)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=61)
    _run(pipeline.dag_id, "2026-01-01T00:00:00+00:00")
    update_pipeline(pipeline.name, aggregation={**DOUBLED, "table": pipeline.table})
    before = table_contents(pipeline.table)

    replay = f"{pipeline.dag_id}__replay"
    _run(replay, "2026-01-01T00:00:00+00:00", topic=topic, from_offset=0, until_offset=1, reason="check")
    assert table_contents(pipeline.table) == before and len(_batches(pipeline.name)) == 1  # dry run by default

    _run(replay, "2026-01-02T00:00:00+00:00", topic=topic, from_time="2020-01-01T00:00:00Z",
         until_time="2100-01-01T00:00:00Z", reason="doubled durations", dry_run=False)
    assert table_contents(pipeline.table) == ground_truth(topic, duration_factor=2)
    assert [kind for kind, *_ in _batches(pipeline.name)] == ["batch", "replay"]
