"""The commit's compare-and-set against the real Postgres: a wrong from-offset changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from kafka_batch import batches, offset_store
from kafka_batch.committer import CommitConflict, FencedAttempt, RangeCounts, commit_batch
from kafka_batch.kafka_source import KafkaOffsets
from kafka_batch.planner import OffsetRange
from tests.integration.helpers import (
    kafka_config,
    new_pipeline,
    pg_connect,
    positions,
    store_connection,
    table_contents,
)

pytestmark = pytest.mark.integration
MINUTE = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _contributions(range_ids: list[int], views: int) -> pa.Table:
    return pa.table({
        "range_id": pa.array(range_ids, pa.int64()),
        "page": ["/"] * len(range_ids),
        "minute": pa.array([MINUTE] * len(range_ids), pa.timestamp("us", tz="UTC")),
        "views": pa.array([views] * len(range_ids), pa.int64()),
        "total_duration_ms": pa.array([10 * views] * len(range_ids), pa.int64()),
    })


def _snapshot(pipeline):
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {pipeline.contributions_table}")
        contributions = cur.fetchone()[0]
        cur.execute("SELECT id, status FROM kafka_batch.batches WHERE pipeline = %s ORDER BY id", (pipeline.name,))
        statuses = cur.fetchall()
    conn.close()
    return positions(pipeline.name), table_contents(pipeline.table), contributions, statuses


def _plan(conn, pipeline, run_id, ranges):
    """Persist hand-made ranges (starting positions stored as planning stores them)."""
    batches.prepare(conn, pipeline)
    with offset_store.transaction(conn) as cur:
        offset_store.lock_pipeline(cur, pipeline.name)
        offset_store.store_initial_positions(cur, pipeline.name, {(r.topic, r.partition): r.from_offset for r in ranges})
        return offset_store.insert_batch(cur, pipeline.name, run_id, None, ranges)


def test_commit_moves_positions_and_totals_once(services):
    pipeline = new_pipeline("cas", partitions=0)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 10)])
    attempt = offset_store.claim_attempt(conn, batch.id)
    ids = [r.range_id for r in batch.ranges]
    commit_batch(conn, pipeline, batch.id, attempt, _contributions(ids, 7), {ids[0]: RangeCounts(7, 1)})
    assert positions(pipeline.name) == {(topic, 0): 10}
    assert table_contents(pipeline.table) == {("/", MINUTE): (7, 70)}

    # Committing the same batch again is a no-op success.
    again = commit_batch(conn, pipeline, batch.id, attempt, _contributions(ids, 7), {ids[0]: RangeCounts(7, 1)})
    assert again.already_committed
    assert table_contents(pipeline.table) == {("/", MINUTE): (7, 70)}

    # A batch that starts at 5 (a repeat) or at 12 (a gap) is refused; nothing changes.
    before = _snapshot(pipeline)
    for n, start in enumerate((5, 12)):
        wrong = _plan(conn, pipeline, f"wrong{n}", [OffsetRange(topic, 0, start, start + 10)])
        attempt = offset_store.claim_attempt(conn, wrong.id)
        rid = [r.range_id for r in wrong.ranges]
        with pytest.raises(CommitConflict, match=rf"{topic}\[0\] {start}..{start + 10} expected position {start} but found stored position 10"):
            commit_batch(conn, pipeline, wrong.id, attempt, _contributions(rid, 3), {rid[0]: RangeCounts(3, 0)})
        after = _snapshot(pipeline)
        assert after[:3] == before[:3]
    conn.close()


def test_stale_attempt_cannot_commit(services):
    pipeline = new_pipeline("fence", partitions=0)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 5)])
    old = offset_store.claim_attempt(conn, batch.id)
    new = offset_store.claim_attempt(conn, batch.id)
    ids = [r.range_id for r in batch.ranges]
    with pytest.raises(FencedAttempt, match=f"attempt {old} is stale"):
        commit_batch(conn, pipeline, batch.id, old, _contributions(ids, 1), {ids[0]: RangeCounts(1, 0)})
    assert positions(pipeline.name) == {(topic, 0): 0}
    commit_batch(conn, pipeline, batch.id, new, _contributions(ids, 1), {ids[0]: RangeCounts(1, 0)})
    assert positions(pipeline.name) == {(topic, 0): 5}
    conn.close()


def test_a_retried_run_gets_the_same_plan(services):
    from kafka_batch_dev import sample_data

    pipeline = new_pipeline("retry")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 400, seed=3)
    conn = store_connection()
    kafka = KafkaOffsets(kafka_config())
    first = batches.plan_batch(conn, kafka, pipeline, run_id="run-1")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 100, seed=4)
    again = batches.plan_batch(conn, kafka, pipeline, run_id="run-1")
    assert (again.id, again.ranges) == (first.id, first.ranges)
    assert first.span == 400
    # A new run plans from the stored positions (none yet) up to the new end, and fences the old plan.
    newer = batches.plan_batch(conn, kafka, pipeline, run_id="run-2")
    assert newer.span == 500
    assert offset_store.load_batch(conn, first.id).status == "superseded"
    # Run ids are unique per DAG only: another DAG's run with the same id is another run.
    elsewhere = batches.plan_batch(conn, kafka, pipeline, run_id="run-2", dag_id="another_dag")
    assert elsewhere.id != newer.id
    assert batches.plan_batch(conn, kafka, pipeline, run_id="run-2").id == newer.id
    conn.close()
