"""Assets: a pipeline's execute step announces each sink table it changed, and only a real commit does.

Through Airflow itself: the pipeline DAG and a downstream DAG scheduled on `Asset("kafka_batch.<table>")`
are parsed into the metadata DB; runs of the pipeline DAG (dry run, commit, empty plan, replay preview,
replay commit) are checked against the asset events recorded and the downstream runs queued.
"""

from __future__ import annotations

import json
import os

import pytest
import sqlalchemy

from kafka_batch_dev import sample_data
from tests.integration.helpers import ROOT, batches_of, kafka_config, new_pipeline, run_airflow, run_dag

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("dag_runs_alone")]

DOWNSTREAM = '''
from airflow.sdk import DAG, Asset, task

with DAG("{dag_id}", schedule=[Asset("kafka_batch.{table}")], catchup=False):
    @task
    def consume():
        pass

    consume()
'''


def _metadata(statement: str, **params) -> list[tuple]:
    engine = sqlalchemy.create_engine(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sqlalchemy.text(statement), params)]
    finally:
        engine.dispose()


def _events(asset: str) -> list[dict]:
    rows = _metadata("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = :name"
                     " ORDER BY e.id", name=asset)
    return [extra if isinstance(extra, dict) else json.loads(extra) for (extra,) in rows]


def _ends(topic: str) -> dict[int, int]:
    """Each partition's end, asked with a plain consumer, not the project's code."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_config(), "group.id": "assets-test", "isolation.level": "read_committed"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    finally:
        consumer.close()


def _queued(dag_id: str) -> int:
    return _metadata("SELECT count(*) FROM asset_dag_run_queue WHERE target_dag_id = :d", d=dag_id)[0][0]


def test_only_a_commit_emits_an_event_per_sink_table_and_queues_the_downstream_dag(services, tmp_path, monkeypatch):
    pipeline = new_pipeline("asset", rows=True)
    topic = pipeline.topics[0]
    aggregate, rows = (f"kafka_batch.{t}" for t in pipeline.tables)
    downstream = f"downstream_of_{pipeline.name}"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "kafka_batch_pipelines.py").write_text((ROOT / "dags" / "kafka_batch_pipelines.py").read_text())
    (dags / "downstream.py").write_text(DOWNSTREAM.format(dag_id=downstream, table=pipeline.tables[0]))
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(dags))
    run_airflow("dags", "reserialize")
    run_airflow("dags", "unpause", downstream)

    sample_data.produce_page_views(kafka_config(), topic, 200, seed=81)
    run_dag(pipeline.dag_id, "2026-02-01T00:00:00+00:00", dry_run=True)
    assert _events(aggregate) == [] and _queued(downstream) == 0  # a dry run announces nothing

    run_dag(pipeline.dag_id, "2026-02-02T00:00:00+00:00")
    [(batch_id, _, status, _, records, _)] = batches_of(pipeline.name)
    assert status == "committed" and records == 200
    ranges = [{"topic": topic, "partition": p, "from_offset": 0, "until_offset": end}
              for p, end in sorted(_ends(topic).items()) if end]
    assert sum(r["until_offset"] for r in ranges) == 200
    expected = {"pipeline": pipeline.name, "batch_id": batch_id, "kind": "batch", "ranges": ranges,
                "records_read": 200, "records_invalid": 0}
    assert _events(aggregate) == [expected] and _events(rows) == [expected]  # one event per sink table
    assert _queued(downstream) == 1  # the downstream DAG is due

    run_dag(pipeline.dag_id, "2026-02-03T00:00:00+00:00")  # nothing new: an empty plan
    assert batches_of(pipeline.name)[-1][2] == "empty"
    run_dag(pipeline.dag_id, "2026-02-02T00:00:00+00:00")  # the committed run again (a clear): a no-op
    run_dag(f"{pipeline.dag_id}__replay", "2026-02-04T00:00:00+00:00", topic=topic, from_offset=0, until_offset=1)
    assert batches_of(pipeline.name)[-1][1:3] == ("replay", "previewed")
    assert len(_events(aggregate)) == 1 and len(_events(rows)) == 1  # none of them announced anything

    run_dag(f"{pipeline.dag_id}__replay", "2026-02-05T00:00:00+00:00", topic=topic, from_offset=0, until_offset=1,
        dry_run=False)
    replay_id = batches_of(pipeline.name)[-1][0]
    assert [e["batch_id"] for e in _events(aggregate)] == [batch_id, replay_id]
    assert _events(aggregate)[-1]["kind"] == "replay"
