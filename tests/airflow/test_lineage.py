"""Lineage through Airflow's OpenLineage provider (its file transport), from real DAG runs in a real
Airflow: the execute task's inputs are the topics with the ledger's exact ranges in a run facet, its
outputs the sink tables with Postgres's columns and the rows the batch changed, counted here from the
topic; a replay says so, and a rewind by the CLI sends its own event through the same settings."""

from __future__ import annotations

import json
import time

import pytest

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    aggregate_table,
    ground_truth,
    kafka_config,
    new_pipeline,
    query,
    rows_truth,
    run_cli,
    run_dag,
    sink_table,
    update_pipeline,
)
from tests.integration.test_end_to_end import _transactional_page_views

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("dag_runs_alone")]


def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _completed_execute(path, dag_id: str, wait: float = 30.0) -> list[dict]:
    """The COMPLETE events of the DAG's execute task (the provider emits from a forked process)."""
    deadline = time.monotonic() + wait
    while True:
        events = _events(path)
        found = [e for e in events if e["eventType"] == "COMPLETE" and e["job"]["name"] == f"{dag_id}.execute"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _ledger_ranges(batch_id: int) -> list[dict]:
    return [{"topic": t, "partition": p, "fromOffset": lo, "untilOffset": hi} for t, p, lo, hi in query(
        "SELECT topic, partition, from_offset, until_offset FROM kafka_batch.batch_ranges WHERE batch_id = %s"
        " ORDER BY topic, partition, from_offset", batch_id)]


def _columns(table: str) -> list[tuple[str, str]]:
    return query(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'public'"
        " AND table_name = %s ORDER BY ordinal_position", table)


def test_a_batch_and_a_replay_tell_the_catalog_their_ranges_and_tables(services, monkeypatch, tmp_path):
    events = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(events), "append": True}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "kafka_batch_tests")
    pipeline = new_pipeline("lineage", rows=True)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 400, seed=71)
    _transactional_page_views(topic, transactions=8, size=20, seed=72)  # one id aborts, then commits again

    run_dag(pipeline.dag_id, "2026-01-01T00:00:00+00:00")
    [event] = _completed_execute(events, pipeline.dag_id)
    (batch_id, database), = query("SELECT id, current_database() FROM kafka_batch.batches WHERE pipeline = %s",
                                  pipeline.name)
    facet = event["run"]["facets"]["kafkaBatch"]
    # dag.test() makes a manual run; a scheduled or backfill run says so the same way (the run's type).
    assert (facet["pipeline"], facet["batchId"], facet["attempt"], facet["kind"]) == (pipeline.name, batch_id, 1, "manual")
    assert facet["ranges"] == _ledger_ranges(batch_id)
    servers = kafka_config()["bootstrap.servers"].split(",")[0]
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(f"kafka://{servers}", topic)]

    postgres = query("SELECT inet_server_port()")[0][0]
    outputs = {d["name"]: d for d in event["outputs"]}
    rows, aggregate = sink_table(pipeline, "rows"), aggregate_table(pipeline)
    assert set(outputs) == {f"{database}.public.{rows}", f"{database}.public.{aggregate}"}
    assert all(d["namespace"].startswith("postgres://") and d["namespace"].endswith(f":{postgres}")
               for d in outputs.values())
    for table, changed in ((rows, len(rows_truth(topic))), (aggregate, len(ground_truth(topic)))):
        dataset = outputs[f"{database}.public.{table}"]
        assert [(f["name"], f["type"]) for f in dataset["facets"]["schema"]["fields"]] == _columns(table)
        assert dataset["outputFacets"]["outputStatistics"]["rowCount"] == changed  # counted from the topic

    replay = f"{pipeline.dag_id}__replay"
    run_dag(replay, "2026-01-02T00:00:00+00:00", topic=topic, from_offset=0, until_offset=1, reason="lineage",
            dry_run=False)
    [replayed] = _completed_execute(events, replay)
    (replay_id,), = query("SELECT id FROM kafka_batch.batches WHERE pipeline = %s AND kind = 'replay'", pipeline.name)
    facet = replayed["run"]["facets"]["kafkaBatch"]
    assert (facet["batchId"], facet["kind"]) == (replay_id, "replay")
    assert facet["ranges"] == _ledger_ranges(replay_id)

    # A rewind of partition 0 to its start, by the CLI: its event names the ranges it took out and the
    # rows it changed (every record of the partition; the (page, minute) totals they added to).
    run_cli("reset", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "0", "--to-offset", "0",
            "--reason", "lineage", "--execute")
    rewinds = [e for e in _events(events) if e["job"]["name"] == f"{pipeline.dag_id}.rewind"]
    assert len(rewinds) == 1 and rewinds[0]["eventType"] == "COMPLETE"
    assert rewinds[0]["job"]["namespace"] == "kafka_batch_tests"
    facet = rewinds[0]["run"]["facets"]["kafkaBatch"]
    assert (facet["pipeline"], facet["kind"]) == (pipeline.name, "rewind") and "batchId" not in facet
    retired = query("SELECT topic, partition, from_offset, until_offset FROM kafka_batch.ledger WHERE pipeline = %s"
                    " AND retired_by LIKE 'reset %%' ORDER BY from_offset", pipeline.name)
    assert retired and facet["ranges"] == [
        {"topic": t, "partition": p, "fromOffset": lo, "untilOffset": hi} for t, p, lo, hi in retired]
    in_partition = lambda partition, offset: partition == 0  # noqa: E731
    outputs = {d["name"]: d["outputFacets"]["outputStatistics"]["rowCount"] for d in rewinds[0]["outputs"]}
    assert outputs == {f"{database}.public.{rows}": len(rows_truth(topic, in_partition)),
                       f"{database}.public.{aggregate}": len(ground_truth(topic, in_partition))}


def test_a_batch_that_publishes_names_its_topic_as_an_output_and_an_asset(services, monkeypatch, tmp_path):
    from kafka_batch.airflow.operators import sink_assets
    from tests.integration.helpers import create_topic

    events = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(events), "append": True}))
    pipeline = new_pipeline("lineagek")
    output = f"{pipeline.name}_out"
    create_topic(output, 1)
    pipeline = update_pipeline(pipeline.name, sinks={"aggregate": pipeline.definition["sinks"]["aggregate"], "kafka": {
        "topic": output, "changelog_of": aggregate_table(pipeline)}})
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 50, seed=73)

    run_dag(pipeline.dag_id, "2026-01-01T00:00:00+00:00")
    [event] = _completed_execute(events, pipeline.dag_id)
    servers = kafka_config()["bootstrap.servers"].split(",")[0]
    database = query("SELECT current_database()")[0][0]
    assert sorted((d["namespace"].split(":")[0], d["name"]) for d in event["outputs"]) == [
        ("kafka", output), ("postgres", f"{database}.public.{aggregate_table(pipeline)}")]
    assert [d["namespace"] for d in event["outputs"] if d["name"] == output] == [f"kafka://{servers}"]
    assert [a.name for a in sink_assets(pipeline)] == [f"kafka_batch.{aggregate_table(pipeline)}",
                                                       f"kafka_batch.topic.{output}"]
