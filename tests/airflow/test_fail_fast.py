"""Bad input fails fast: a replay asked for with offsets that make no sense, or a partition the
pipeline never read, or a definition whose expression does not resolve, fails its run at once
(AirflowFailException: no retry) and changes nothing."""

from __future__ import annotations

import pytest

from kafka_batch_dev import sample_data
from tests.airflow.test_assets import _metadata
from tests.integration.helpers import (
    batches_of,
    kafka_config,
    new_pipeline,
    positions,
    run_cli,
    run_dag,
    table_contents,
    update_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("dag_runs_alone")]


def test_invalid_replay_params_fail_without_retries_and_change_nothing(services):
    pipeline = new_pipeline("failfast", partitions=2)
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 100, seed=95)
    run_cli("run", "--pipeline", pipeline.name)
    before = (positions(pipeline.name), batches_of(pipeline.name), table_contents(pipeline))
    replay = f"{pipeline.dag_id}__replay"
    for day, conf in ((1, {"from_offset": 5, "until_offset": 2}), (2, {"partitions": [7], "from_offset": 0,
                                                                         "until_offset": 10})):
        result = run_dag(replay, f"2026-03-0{day}T00:00:00+00:00", check=False, topic=pipeline.topics[0],
                         dry_run=False, **conf)
        assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    attempts = _metadata("SELECT state, try_number FROM task_instance WHERE dag_id = :d AND task_id = 'plan'", d=replay)
    assert attempts == [("failed", 1), ("failed", 1)]  # retries=2, yet no second try
    assert (positions(pipeline.name), batches_of(pipeline.name), table_contents(pipeline)) == before


def test_a_typo_in_an_expression_fails_the_plan_task_once_with_its_one_line_and_plans_nothing(services):
    pipeline = new_pipeline("failfastexpr", partitions=1)
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 50, seed=96)
    good = pipeline.definition["sinks"]
    pipeline = update_pipeline(pipeline.name, sinks={**good, "aggregate": {**good["aggregate"], "measures": {
        **good["aggregate"]["measures"], "total_duration_ms": "duration"}}})
    result = run_dag(pipeline.dag_id, "2026-03-03T00:00:00+00:00", check=False)
    assert result.returncode == 1, result.stdout[-3000:]
    assert ("sinks.aggregate.measures.total_duration_ms: `duration` is not a field or metadata column of the record"
            " (close: `duration_ms`" in result.stdout), result.stdout[-3000:]
    attempts = _metadata("SELECT state, try_number FROM task_instance WHERE dag_id = :d AND task_id = 'plan'",
                         d=pipeline.dag_id)
    assert attempts == [("failed", 1)]  # bad input: no retry
    assert batches_of(pipeline.name) == [] and positions(pipeline.name) == {}
