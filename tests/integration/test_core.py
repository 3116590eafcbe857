"""The exactly-once core against the real Postgres, without Spark: seconds, not minutes.

Hand-made Arrow results stand in for what Spark computes; the rows sink's executor writer runs
in-process. Expected outputs are written down from the hand-made input, never recomputed by the
code under test.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import psycopg2
import psycopg2.errors
import pyarrow as pa
import pytest

from kafka_batch import connections
from kafka_batch.core import attempts, batches, database, ledger, planning, registry
from kafka_batch.core.commit import commit_batch, preview_replay, retire_ranges
from kafka_batch.core.positions import store_initial_positions
from kafka_batch.core.resets import reset_positions
from kafka_batch.core.state import ALLOWED, BatchStatus, check, sources
from kafka_batch.errors import FencedAttempt, InputError, StateError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch.sinks import staging
from kafka_batch.sinks.base import RangeCounts, SinkOutput
from kafka_batch.sinks.rows import KEY, rows_to_stage
from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    admin_client,
    kafka_config,
    new_pipeline,
    pg_connect,
    positions,
    query,
    rows_contents,
    sink_table,
    store_connection,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration
MINUTE = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _postgres() -> dict:
    return connections.postgres_params(connections.from_environment("kafka_batch_postgres"))


def _sink(pipeline, kind):
    return next(s for s in pipeline.sinks if s.kind == kind)


def _plan(conn, pipeline, run_id, ranges):
    """Persist hand-made ranges (starting positions stored as planning stores them)."""
    planning.prepare(conn, pipeline)
    with database.transaction(conn) as cur:
        registry.lock_pipeline(cur, pipeline.name)
        store_initial_positions(cur, pipeline.name, {(r.topic, r.partition): r.from_offset for r in ranges})
        return batches.insert_batch(cur, pipeline, run_id, None, ranges)


def _aggregate_output(batch, views_per_range: int, page: str = "/") -> SinkOutput:
    """Each range contributes `views_per_range` views of `page` in MINUTE (duration 10 per view)."""
    ids = [r.range_id for r in batch.ranges]
    table = pa.table({
        "range_id": pa.array(ids, pa.int64()),
        "page": [page] * len(ids),
        "minute": pa.array([MINUTE] * len(ids), pa.timestamp("us", tz="UTC")),
        "views": pa.array([views_per_range] * len(ids), pa.int64()),
        "total_duration_ms": pa.array([10 * views_per_range] * len(ids), pa.int64()),
    })
    return SinkOutput({i: RangeCounts(views_per_range, 0) for i in ids}, table)


def _rows_output(pipeline, batch, attempt, views_per_range: int, page: str = "/") -> SinkOutput:
    """The rows sink's executor writer, run in-process: one row per offset from each range's start."""
    sink = _sink(pipeline, "rows")
    name = staging.create_stage(_postgres(), batch.id, attempt, sink.kind, sink._target)
    rows = [(r.range_id, r.topic, r.partition, r.from_offset + n) for r in batch.ranges for n in range(views_per_range)]
    data = pa.RecordBatch.from_pydict({
        "range_id": pa.array([r[0] for r in rows], pa.int64()),
        "_tombstone": pa.array([False] * len(rows)),
        "_invalid": pa.array([False] * len(rows)),  # the writer gets `_invalid` as a flag (rows.py compute)
        "kafka_topic": [r[1] for r in rows],
        "kafka_partition": pa.array([r[2] for r in rows], pa.int32()),
        "kafka_offset": pa.array([r[3] for r in rows], pa.int64()),
        "user_id": ["u"] * len(rows),
        "page": [page] * len(rows),
        "duration_ms": pa.array([10] * len(rows), pa.int64()),
        "viewed_at": pa.array([MINUTE] * len(rows), pa.timestamp("us", tz="UTC")),
    })
    [written] = list(staging.stage_task(_postgres(), name, KEY, sink.column_names, rows_to_stage)(iter([data])))
    counts, staged = staging.reported(pa.Table.from_batches([written]), name)
    assert staged.rows == len(rows)
    return SinkOutput(counts, staged)


def _outputs(pipeline, batch, attempt, views: int, page: str = "/") -> dict:
    return {"aggregate": _aggregate_output(batch, views, page), "rows": _rows_output(pipeline, batch, attempt, views, page)}


def _committed(conn, pipeline, run_id: str, ranges: list[OffsetRange], views: int, page: str = "/"):
    """Plan hand-made ranges and commit both sinks' hand-made outputs for them."""
    batch = _plan(conn, pipeline, run_id, ranges)
    attempt = attempts.claim_attempt(conn, batch.id)
    commit_batch(conn, pipeline, batch.id, attempt, _outputs(pipeline, batch, attempt, views, page))
    return batch


def _state(pipeline):
    """Everything a refused commit must leave alone."""
    return (positions(pipeline.name), table_contents(pipeline), rows_contents(pipeline),
            query("SELECT count(*) FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b ON b.id = r.batch_id"
                  " WHERE b.pipeline = %s AND b.status = 'committed'", pipeline.name))


def _stages(batch_id: int) -> list[str]:
    return [r[0] for r in query("SELECT tablename FROM pg_tables WHERE schemaname = 'kafka_batch_stage'"
                                " AND tablename LIKE %s", f"b{batch_id}\\_%")]


def test_commit_moves_positions_and_every_sink_once(services):
    pipeline = new_pipeline("cas", partitions=0, rows=True)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 0, 10)])
    attempt = attempts.claim_attempt(conn, batch.id)
    outputs = _outputs(pipeline, batch, attempt, 7)
    result = commit_batch(conn, pipeline, batch.id, attempt, outputs, read_tasks=2)
    assert (result.records, result.rows_written) == (14, 1 + 14)  # one total (two ranges' contributions), 14 rows
    assert positions(pipeline.name) == {(topic, 0): 10, (topic, 1): 10}
    assert table_contents(pipeline) == {("/", MINUTE): (14, 140)}
    assert sorted(rows_contents(pipeline)) == [(topic, p, o) for p in (0, 1) for o in range(7)]
    assert _stages(batch.id) == []  # the commit moved the staged rows and dropped the stage
    assert query("SELECT status, records_read, read_tasks FROM kafka_batch.batches WHERE id = %s", batch.id) == [
        ("committed", 14, 2)]

    # Committing the same batch again is a no-op success.
    assert commit_batch(conn, pipeline, batch.id, attempt, outputs).already_committed
    assert table_contents(pipeline) == {("/", MINUTE): (14, 140)}

    # A batch that starts at 5 (a repeat) or at 12 (a gap) is refused; nothing changes.
    before = _state(pipeline)
    for n, start in enumerate((5, 12)):
        wrong = _plan(conn, pipeline, f"wrong{n}", [OffsetRange(topic, 0, start, start + 10)])
        attempt = attempts.claim_attempt(conn, wrong.id)
        with pytest.raises(StateError, match=rf"{topic}\[0\] {start}..{start + 10} expected position {start} but found"
                                             r" stored position 10"):
            commit_batch(conn, pipeline, wrong.id, attempt, _outputs(pipeline, wrong, attempt, 3))
        assert _state(pipeline) == before
    # One statement moves every range: one range that does not match (partition 1) and the one that
    # does (partition 0) does not move either.
    wrong = _plan(conn, pipeline, "wrong_one_of_two", [OffsetRange(topic, 0, 10, 20), OffsetRange(topic, 1, 5, 15)])
    attempt = attempts.claim_attempt(conn, wrong.id)
    with pytest.raises(StateError, match=rf"{topic}\[1\] 5..15 expected position 5 but found stored position 10"):
        commit_batch(conn, pipeline, wrong.id, attempt, _outputs(pipeline, wrong, attempt, 3))
    assert _state(pipeline) == before
    conn.close()


def test_staged_rows_that_are_not_the_counted_records_are_refused(services):
    pipeline = new_pipeline("lostrows", partitions=0, rows=True)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 10)])
    attempt = attempts.claim_attempt(conn, batch.id)
    outputs = _outputs(pipeline, batch, attempt, 7)
    stage = outputs["rows"].result.stage
    lost = pg_connect()
    lost.cursor().execute(f"DELETE FROM kafka_batch_stage.{stage} WHERE kafka_offset = 3")  # a task's lost write
    lost.close()
    before = _state(pipeline)
    with pytest.raises(StateError, match=f"the rows sink staged 6 rows for 7 counted records in {stage}"):
        commit_batch(conn, pipeline, batch.id, attempt, outputs)
    assert _state(pipeline) == before
    conn.close()


def _contributions(rows: list[tuple[int, str, int]]) -> pa.Table:
    """Aggregate result rows (range id, page, views) in MINUTE, duration 10 per view."""
    return pa.table({
        "range_id": pa.array([r[0] for r in rows], pa.int64()),
        "page": [r[1] for r in rows],
        "minute": pa.array([MINUTE] * len(rows), pa.timestamp("us", tz="UTC")),
        "views": pa.array([r[2] for r in rows], pa.int64()),
        "total_duration_ms": pa.array([10 * r[2] for r in rows], pa.int64()),
    })


def test_aggregate_keys_in_one_or_several_ranges_add_up_and_a_key_twice_in_a_range_is_refused(services):
    pipeline = new_pipeline("agg_keys", partitions=0)
    topic = pipeline.topics[0]
    conn = store_connection()
    ranges = [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 0, 10)]
    first = _plan(conn, pipeline, "r1", ranges)
    one, two = (r.range_id for r in first.ranges)
    # /a in both ranges (added up across them), /b and /c in one each.
    result = _contributions([(one, "/a", 2), (two, "/a", 3), (two, "/b", 4), (one, "/c", 1)])
    attempt = attempts.claim_attempt(conn, first.id)
    commit_batch(conn, pipeline, first.id, attempt, {"aggregate": SinkOutput({one: RangeCounts(3), two: RangeCounts(7)},
                                                                             result)})
    assert table_contents(pipeline) == {("/a", MINUTE): (5, 50), ("/b", MINUTE): (4, 40), ("/c", MINUTE): (1, 10)}

    # Every key in one range this time: existing keys are added to, new ones inserted.
    second = _plan(conn, pipeline, "r2", [OffsetRange(topic, 0, 10, 20), OffsetRange(topic, 1, 10, 20)])
    one, two = (r.range_id for r in second.ranges)
    attempt = attempts.claim_attempt(conn, second.id)
    commit_batch(conn, pipeline, second.id, attempt, {"aggregate": SinkOutput(
        {one: RangeCounts(1), two: RangeCounts(6)}, _contributions([(one, "/a", 1), (two, "/b", 2), (two, "/d", 4)]))})
    expected = {("/a", MINUTE): (6, 60), ("/b", MINUTE): (6, 60), ("/c", MINUTE): (1, 10), ("/d", MINUTE): (4, 40)}
    assert table_contents(pipeline) == expected

    # Two rows for one (range, key) would add that key twice: refused, nothing changes.
    third = _plan(conn, pipeline, "r3", [OffsetRange(topic, 0, 20, 30), OffsetRange(topic, 1, 20, 30)])
    one, two = (r.range_id for r in third.ranges)
    attempt = attempts.claim_attempt(conn, third.id)
    before = positions(pipeline.name)
    with pytest.raises(StateError, match="1 duplicate \\(range, key\\) rows; nothing was committed"):
        commit_batch(conn, pipeline, third.id, attempt, {"aggregate": SinkOutput(
            {one: RangeCounts(3), two: RangeCounts(1)}, _contributions([(one, "/a", 1), (two, "/a", 1), (one, "/a", 2)]))})
    assert positions(pipeline.name) == before and table_contents(pipeline) == expected

    # Keys in both ranges again, one of them in the totals already: its sums are added to its total.
    attempt = attempts.claim_attempt(conn, third.id)
    commit_batch(conn, pipeline, third.id, attempt, {"aggregate": SinkOutput(
        {one: RangeCounts(3), two: RangeCounts(4)},
        _contributions([(one, "/a", 1), (two, "/a", 2), (one, "/e", 2), (two, "/e", 2)]))})
    expected = {**expected, ("/a", MINUTE): (9, 90), ("/e", MINUTE): (4, 40)}
    assert table_contents(pipeline) == expected

    # A sum past bigint's bounds (10 * 2^59 ms in each range) is refused by Postgres, never wrapped around.
    fourth = _plan(conn, pipeline, "r4", [OffsetRange(topic, 0, 30, 40), OffsetRange(topic, 1, 30, 40)])
    one, two = (r.range_id for r in fourth.ranges)
    attempt = attempts.claim_attempt(conn, fourth.id)
    before = positions(pipeline.name)
    with pytest.raises(psycopg2.errors.NumericValueOutOfRange, match="bigint out of range"):
        commit_batch(conn, pipeline, fourth.id, attempt, {"aggregate": SinkOutput(
            {one: RangeCounts(1), two: RangeCounts(1)}, _contributions([(one, "/big", 2**59), (two, "/big", 2**59)]))})
    assert positions(pipeline.name) == before and table_contents(pipeline) == expected
    conn.close()


def test_a_stale_attempt_cannot_commit_and_its_staged_rows_are_never_moved(services):
    pipeline = new_pipeline("fence", partitions=0, rows=True)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 5)])
    old = attempts.claim_attempt(conn, batch.id)
    zombie = _outputs(pipeline, batch, old, 5, page="/zombie")
    new = attempts.claim_attempt(conn, batch.id)
    with pytest.raises(FencedAttempt, match=f"attempt {old} is stale"):
        commit_batch(conn, pipeline, batch.id, old, zombie)
    assert positions(pipeline.name) == {(topic, 0): 0} and rows_contents(pipeline) == {}
    commit_batch(conn, pipeline, batch.id, new, _outputs(pipeline, batch, new, 5))
    assert positions(pipeline.name) == {(topic, 0): 5}
    assert {v[1] for v in rows_contents(pipeline).values()} == {"/"}  # the zombie's rows never landed
    assert table_contents(pipeline) == {("/", MINUTE): (5, 50)}
    # A committed batch cannot start another attempt.
    with pytest.raises(StateError, match=f"batch {batch.id} is committed; it can no longer be executed"):
        attempts.claim_attempt(conn, batch.id)
    conn.close()


def test_statuses_move_only_as_the_table_allows(services):
    for old in BatchStatus:
        for new in BatchStatus:
            if new in ALLOWED[old]:
                check(1, old, new)
            else:
                with pytest.raises(StateError, match=f"batch 1 is {old.value}; it cannot become {new.value}"):
                    check(1, old, new)
    assert sources(BatchStatus.COMMITTED) == ["planned", "failed"]
    pipeline = new_pipeline("states", partitions=0)
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(pipeline.topics[0], 0, 0, 5)])
    attempt = attempts.claim_attempt(conn, batch.id)
    attempts.mark_failed(conn, batch.id, attempt, "boom")
    assert batches.load_batch(conn, batch.id).status == BatchStatus.FAILED
    commit_batch(conn, pipeline, batch.id, attempt, {"aggregate": _aggregate_output(batch, 1)})
    attempts.mark_failed(conn, batch.id, attempt, "too late")  # committed is final: nothing changes
    committed = batches.load_batch(conn, batch.id)
    assert (committed.status, committed.error) == (BatchStatus.COMMITTED, None)
    with database.transaction(conn) as cur:
        assert not batches.set_status(cur, batch.id, BatchStatus.SUPERSEDED)
    # Superseding a failed batch keeps its diagnosis.
    failed = _plan(conn, pipeline, "r2", [OffsetRange(pipeline.topics[0], 0, 5, 9)])
    attempts.mark_failed(conn, failed.id, attempts.claim_attempt(conn, failed.id), "ValueError: the first diagnosis")
    _plan(conn, pipeline, "r3", [OffsetRange(pipeline.topics[0], 0, 5, 9)])
    superseded = batches.load_batch(conn, failed.id)
    assert superseded.status == BatchStatus.SUPERSEDED
    assert superseded.error == "superseded by a newer plan; it had failed: ValueError: the first diagnosis"
    conn.close()


def test_sinks_remove_exactly_the_ranges_they_are_given(services):
    pipeline = new_pipeline("remove", partitions=0, rows=True)
    topic = pipeline.topics[0]
    conn = store_connection()
    first = _committed(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 10)], 4, page="/a")
    second = _committed(conn, pipeline, "r2", [OffsetRange(topic, 0, 10, 20)], 3, page="/a")
    assert table_contents(pipeline) == {("/a", MINUTE): (7, 70)}

    with database.transaction(conn) as cur:
        retire_ranges(cur, pipeline, list(first.ranges), "test")
    assert table_contents(pipeline) == {("/a", MINUTE): (3, 30)}
    assert sorted(rows_contents(pipeline)) == [(topic, 0, o) for o in (10, 11, 12)]
    with database.transaction(conn) as cur:
        retire_ranges(cur, pipeline, list(second.ranges), "test")
    assert table_contents(pipeline) == {} and rows_contents(pipeline) == {}  # keys left with nothing disappear
    conn.close()


def test_a_replay_swaps_and_its_preview_changes_nothing(services):
    pipeline = new_pipeline("swap", partitions=0, rows=True)
    topic = pipeline.topics[0]
    conn = store_connection()
    _committed(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 10)], 4, page="/old")

    def replay(run_id):
        with database.transaction(conn) as cur:
            replayed = ledger.live_ranges(cur, pipeline.name, topic, 0)
            return batches.insert_replay(cur, pipeline, run_id, None, replayed, "test", "test")

    dry = replay("dry")
    attempt = attempts.claim_attempt(conn, dry.id)
    before = _state(pipeline)
    result = preview_replay(conn, pipeline, dry.id, attempt, _outputs(pipeline, dry, attempt, 4, page="/new"))
    assert _state(pipeline) == before and batches.load_batch(conn, dry.id).status == BatchStatus.PREVIEWED
    previews = batches.replay_preview(conn, dry.id)
    aggregate = [p for p in previews if p["table"] == _sink(pipeline, "aggregate").table]
    assert [(p["group_key"]["page"], p["before"], p["after"]) for p in aggregate] == [
        ("/new", None, {"views": 4, "total_duration_ms": 40}), ("/old", {"views": 4, "total_duration_ms": 40}, None)]
    rows = [p for p in previews if p["table"] == sink_table(pipeline, "rows")]
    assert len(rows) == 4 and all(p["before"]["page"] == "/old" and p["after"]["page"] == "/new" for p in rows)
    assert result.rows_written == len(previews)

    real = replay("real")
    attempt = attempts.claim_attempt(conn, real.id)
    commit_batch(conn, pipeline, real.id, attempt, _outputs(pipeline, real, attempt, 4, page="/new"))
    assert table_contents(pipeline) == {("/new", MINUTE): (4, 40)}
    assert {v[1] for v in rows_contents(pipeline).values()} == {"/new"}
    assert positions(pipeline.name) == {(topic, 0): 10}  # a replay never moves a position
    conn.close()


def test_a_batch_keeps_the_definition_it_was_planned_with(services):
    pipeline = new_pipeline("snapshot", partitions=0)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 5)])
    changed = update_pipeline(pipeline.name, limits={"max_records_per_task": 3})  # an operator edits the YAML
    assert changed.definition_hash != pipeline.definition_hash
    planned = batches.batch_pipeline(conn, batches.load_batch(conn, batch.id))
    assert planned == pipeline and planned.limits.max_records_per_task == pipeline.limits.max_records_per_task
    attempt = attempts.claim_attempt(conn, batch.id)
    commit_batch(conn, planned, batch.id, attempt, {"aggregate": _aggregate_output(batch, 2)})
    assert query("SELECT definition_hash FROM kafka_batch.ledger WHERE batch_id = %s", batch.id) == [
        (pipeline.definition_hash,)]
    [(stored,)] = query("SELECT definition::text FROM kafka_batch.definitions WHERE hash = %s", pipeline.definition_hash)
    assert json.loads(stored) == pipeline.definition
    conn.close()


def test_a_table_with_other_columns_is_refused_with_how_to_migrate(services):
    pipeline = new_pipeline("columns", partitions=0, rows=True)
    conn = store_connection()
    planning.prepare(conn, pipeline)
    sink = _sink(pipeline, "rows")
    narrower = sink.model_copy(update={"columns": sink.columns[:1]})
    with pytest.raises(Exception, match=r"exists with columns .* Migrate it first"), database.transaction(conn) as cur:
        narrower.create(cur, pipeline.name)
    aggregate = _sink(pipeline, "aggregate")
    renamed = aggregate.model_copy(update={"group_by": aggregate.group_by[:1]})
    with pytest.raises(Exception, match=rf"table public.{aggregate.table} exists"), database.transaction(conn) as cur:
        renamed.create(cur, pipeline.name)
    conn.close()


def test_a_retried_run_gets_the_same_plan(services):
    pipeline = new_pipeline("retry")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 400, seed=3)
    conn = store_connection()
    kafka = KafkaOffsets(kafka_config())
    first = planning.plan_batch(conn, kafka, pipeline, run_id="run-1")
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 100, seed=4)
    again = planning.plan_batch(conn, kafka, pipeline, run_id="run-1")
    assert (again.id, again.ranges) == (first.id, first.ranges)
    assert first.span == 400
    # A new run plans from the stored positions (none yet) up to the new end, and fences the old plan.
    newer = planning.plan_batch(conn, kafka, pipeline, run_id="run-2")
    assert newer.span == 500
    assert batches.load_batch(conn, first.id).status == BatchStatus.SUPERSEDED
    # Run ids are unique per DAG only: another DAG's run with the same id is another run.
    elsewhere = planning.plan_batch(conn, kafka, pipeline, run_id="run-2", dag_id="another_dag")
    assert elsewhere.id != newer.id
    assert planning.plan_batch(conn, kafka, pipeline, run_id="run-2").id == newer.id
    conn.close()


def test_quarantined_records_commit_with_the_batch_and_leave_with_their_range(services):
    pipeline = new_pipeline("quarantine", partitions=0)
    topic = pipeline.topics[0]
    conn = store_connection()
    batch = _plan(conn, pipeline, "r1", [OffsetRange(topic, 0, 0, 10)])
    attempt = attempts.claim_attempt(conn, batch.id)
    [range_id] = [r.range_id for r in batch.ranges]
    bad = pa.table({
        "range_id": pa.array([range_id, range_id], pa.int64()), "topic": [topic, topic],
        "partition": pa.array([0, 0], pa.int32()), "offset": pa.array([3, 8], pa.int64()),
        "timestamp": pa.array([MINUTE, None], pa.timestamp("us", tz="UTC")), "key": [b"k\t1", None],
        "value": [b"\x00not json\n", b"{}"], "value_bytes": pa.array([10, 2], pa.int32()),
        "reason": ["not a JSON object", "tab\there, newline\nthere, backslash \\"],
    })
    output = _aggregate_output(batch, 2)
    counts = {range_id: RangeCounts(2, 0, 2)}
    commit_batch(conn, pipeline, batch.id, attempt, {"aggregate": SinkOutput(counts, output.result)}, quarantined=bad)
    rows = query('SELECT "offset", key, value, value_bytes, reason, batch_id, "timestamp" FROM kafka_batch.quarantine'
                 " WHERE pipeline = %s ORDER BY 1", pipeline.name)
    assert [(o, bytes(k) if k else None, bytes(v), n, r, b, t) for o, k, v, n, r, b, t in rows] == [
        (3, b"k\t1", b"\x00not json\n", 10, "not a JSON object", batch.id, MINUTE),
        (8, None, b"{}", 2, "tab\there, newline\nthere, backslash \\", batch.id, None)]
    assert query("SELECT records_read, records_invalid FROM kafka_batch.batch_ranges WHERE id = %s", range_id) == [(2, 2)]
    assert query("SELECT records_invalid FROM kafka_batch.batches WHERE id = %s", batch.id) == [(2,)]
    with database.transaction(conn) as cur:
        retire_ranges(cur, pipeline, list(batch.ranges), "test")  # a replay or rewind decides anew
    assert query("SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %s", pipeline.name) == [(0,)]
    conn.close()


def test_status_never_waits_behind_a_running_commit(services):
    """Reading status runs no DDL, so it does not queue behind the locks a commit holds."""
    from kafka_batch.core import report

    pipeline = new_pipeline("nowait", rows=True)
    conn = store_connection()
    planning.plan_batch(conn, KafkaOffsets(kafka_config()), pipeline, run_id="r1")
    committing = pg_connect()
    committing.autocommit = False
    with committing.cursor() as cur:  # what a commit holds: the pipeline row and rows of its tables
        cur.execute("SELECT 1 FROM kafka_batch.pipelines WHERE name = %s FOR UPDATE", (pipeline.name,))
        cur.execute(f"LOCK TABLE public.{sink_table(pipeline, 'aggregate')} IN ROW EXCLUSIVE MODE")
        cur.execute(f"LOCK TABLE public.{sink_table(pipeline, 'rows')} IN ROW EXCLUSIVE MODE")
        with database.transaction(conn) as reading:
            reading.execute("SET lock_timeout = '2s'")  # the session waits 2 s at most, then fails
        rows = report.status(conn, KafkaOffsets(kafka_config()), pipeline)
    committing.rollback()
    committing.close()
    assert len(rows) == 3
    conn.close()


def test_an_unknown_topic_is_refused_before_anything_is_stored(services):
    pipeline = new_pipeline("notopic", partitions=0)
    conn = store_connection()
    with pytest.raises(InputError, match=rf"topic '{pipeline.topics[0]}' does not exist"):
        planning.plan_batch(conn, KafkaOffsets(kafka_config()), pipeline, run_id="r1")
    # Asking for it by name did not create it (the broker creates a topic a producer's request names).
    assert pipeline.topics[0] not in admin_client().list_topics(timeout=30).topics
    assert query("SELECT count(*) FROM kafka_batch.pipelines WHERE name = %s", pipeline.name) == [(0,)]
    assert query("SELECT to_regclass(%s)", f"public.{sink_table(pipeline, 'aggregate')}") == [(None,)]
    conn.close()


def test_the_pipeline_runs_as_a_role_with_no_rights_beyond_its_own(services):
    """sql/roles.sql: the pipeline's login is no superuser, owns what it created, and cannot reach
    another application's table, create a schema or a database."""
    if os.environ.get("KAFKA_BATCH_TEST_POSTGRES"):
        pytest.skip("needs the embedded Postgres's administrator")
    params = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
    admin = psycopg2.connect(**{**params, "user": "postgres"})
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS public.another_apps_secrets (secret text)")
    admin.close()
    planner = store_connection()
    planning.plan_batch(planner, KafkaOffsets(kafka_config()), new_pipeline("role", partitions=1), "r1")
    planner.close()

    conn = pg_connect()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT rolname, rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls"
                    " FROM pg_roles WHERE rolname = current_user")
        assert cur.fetchone() == ("kafka_batch_pipeline", False, False, False, False, False)
        cur.execute("SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n"
                    " ON n.oid = c.relnamespace WHERE n.nspname = 'kafka_batch' AND c.relkind IN ('r', 'v')")
        assert cur.fetchall() == [("kafka_batch_pipeline",)]  # the migrations ran as the pipeline
        for statement in ("SELECT * FROM public.another_apps_secrets", "CREATE SCHEMA intruder",
                          "CREATE DATABASE intruder", "CREATE ROLE intruder",
                          "ALTER TABLE public.another_apps_secrets ADD COLUMN x int"):
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(statement)
    conn.close()


# SQL, a COPY row break and escapes: a topic name, a key and a value are data wherever they go.
HOSTILE = "x'); DROP TABLE kafka_batch.offsets; --\"\t\\N\n\\"


def test_hostile_topic_names_keys_and_values_are_data(services):
    pipeline = new_pipeline("hostile", partitions=0, rows=True, topics=[HOSTILE])
    conn = store_connection()
    _committed(conn, pipeline, "r1", [OffsetRange(HOSTILE, 0, 0, 5)], 5, page=HOSTILE)
    assert positions(pipeline.name) == {(HOSTILE, 0): 5}
    assert table_contents(pipeline) == {(HOSTILE, MINUTE): (5, 50)}  # a group key
    rows = rows_contents(pipeline)
    assert sorted(rows) == [(HOSTILE, 0, o) for o in range(5)]  # COPYed by the executors' writer
    assert {values[1] for values in rows.values()} == {HOSTILE}
    # The planner asks Kafka about it as a name, and refuses it as unknown; nothing else is touched.
    with pytest.raises(InputError, match="does not exist"):
        planning.plan_batch(conn, KafkaOffsets(kafka_config()), pipeline, run_id="r2")
    assert positions(pipeline.name) == {(HOSTILE, 0): 5}
    assert query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name) == [(1,)]
    conn.close()


def test_ranges_beyond_the_replay_horizon_fold_keeping_the_totals_and_refuse_replays(services):
    pipeline = new_pipeline("horizon", partitions=1, rows=True, replayable={"batches": 2})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 40)  # offsets for the rewind and replay to ask about
    contributions = f"kafka_batch.{_sink(pipeline, 'aggregate').contributions_name}"
    conn = store_connection()
    batches = [_committed(conn, pipeline, f"r{n}", [OffsetRange(topic, 0, 10 * n, 10 * n + 10)], n + 1, page="/a")
               for n in range(4)]
    # 1+2+3+4 views; the two oldest batches left the horizon: one base row holds their 3 views.
    assert table_contents(pipeline) == {("/a", MINUTE): (10, 100)}
    assert query(f"SELECT range_id, views FROM {contributions} ORDER BY range_id") == [
        (0, 3), (batches[2].ranges[0].range_id, 3), (batches[3].ranges[0].range_id, 4)]
    folded = query("SELECT batch_id FROM kafka_batch.batch_ranges WHERE folded_at IS NOT NULL ORDER BY 1 ")
    assert [b for (b,) in folded if b in {x.id for x in batches}] == [batches[0].id, batches[1].id]

    # A range inside the horizon still leaves exactly; the base keeps the key alive.
    with database.transaction(conn) as cur:
        retire_ranges(cur, pipeline, list(batches[3].ranges), "test")
    assert table_contents(pipeline) == {("/a", MINUTE): (6, 60)}
    with database.transaction(conn) as cur:
        retire_ranges(cur, pipeline, list(batches[2].ranges), "test")
    assert table_contents(pipeline) == {("/a", MINUTE): (3, 30)}
    assert sorted(o for _, _, o in rows_contents(pipeline)) == [0, 10, 11]  # the rows sink removes by offset

    # Replays and rewinds of folded ranges are refused, naming the horizon; nothing changes.
    before = _state(pipeline)
    kafka = KafkaOffsets(kafka_config())
    with pytest.raises(InputError, match=r"folded into the totals on .*\(replayable: the newest 2 committed batches"):
        planning.plan_replay(conn, kafka, pipeline, planning.OffsetRequest(topic, (0,), 5, 15), run_id="replay",
                             requested_by="test", reason="test")
    with pytest.raises(InputError, match=r"rewind of .*\[0\] to 0: range .* was folded into the totals"):
        reset_positions(conn, kafka, pipeline, planning.OffsetRequest(topic, (0,), from_offset=0), requested_by="test",
                        reason="test")
    with pytest.raises(InputError, match="folded into the totals"):
        planning.recompute_batch(conn, pipeline, batches[1], requested_by="test")
    assert _state(pipeline) == before
    conn.close()


def test_the_replay_horizon_is_validated(services):
    from kafka_batch.config import parse_pipeline

    definition = {**new_pipeline("horizonbad", partitions=0).definition}
    for bad, named in (({"batches": 2.5}, r"replayable.batches: Input should be a valid integer \(got 2.5\)"),
                       ({"batches": 0}, r"replayable.batches: Input should be greater than 0"),
                       ({"weeks": 1}, r"replayable: unknown key\(s\) \['weeks'\]")):
        with pytest.raises(InputError, match=named):
            parse_pipeline({**definition, "replayable": bad})
    assert str(parse_pipeline({**definition, "replayable": {"days": 30}}).replayable) == "the last 30 days"


class _CountingCursor(psycopg2.extensions.cursor):
    """Counts the statements sent through cursors of its kind."""

    statements = 0

    def execute(self, query, vars=None):
        _CountingCursor.statements += 1
        return super().execute(query, vars)

    def copy_expert(self, sql, file, size=8192):
        _CountingCursor.statements += 1
        return super().copy_expert(sql, file, size)


def test_a_thousand_ranges_commit_in_the_statements_of_four_and_one_wrong_range_of_them_refuses_all(services):
    pipeline = new_pipeline("many_ranges", partitions=0)
    topic = pipeline.topics[0]
    conn = store_connection()
    conn.cursor_factory = _CountingCursor
    statements = {}
    for partitions in (4, 1000):
        batch = _plan(conn, pipeline, f"r{partitions}", [OffsetRange(topic, 1000 + p if partitions == 4 else p, 0, 10)
                                                         for p in range(partitions)])
        attempt = attempts.claim_attempt(conn, batch.id)
        _CountingCursor.statements = 0
        commit_batch(conn, pipeline, batch.id, attempt, {"aggregate": _aggregate_output(batch, 2)})
        statements[partitions] = _CountingCursor.statements
    assert statements[1000] == statements[4], statements  # none per range: positions, ledger, counts in one each
    assert table_contents(pipeline) == {("/", MINUTE): (2 * 1004, 20 * 1004)}
    assert len(query("SELECT 1 FROM kafka_batch.ledger WHERE pipeline = %s", pipeline.name)) == 1004

    # The next thousand ranges, one of which (partition 617) starts where no batch ended: nothing commits.
    def state():
        return (positions(pipeline.name), table_contents(pipeline),
                query("SELECT count(*) FROM kafka_batch.ledger WHERE pipeline = %s", pipeline.name))

    before = state()
    wrong = _plan(conn, pipeline, "wrong", [OffsetRange(topic, p, 9 if p == 617 else 10, 20) for p in range(1000)])
    attempt = attempts.claim_attempt(conn, wrong.id)
    with pytest.raises(StateError, match=rf"{topic}\[617\] 9..20 expected position 9 but found stored position 10"):
        commit_batch(conn, pipeline, wrong.id, attempt, {"aggregate": _aggregate_output(wrong, 2)})
    assert state() == before
    conn.close()
