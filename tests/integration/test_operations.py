"""Replays and resets through the CLI against the real services, checked against the ground truth.

Expected totals are read from the topic with a plain consumer (tests/integration/helpers.py), with
the records each operation should have recomputed, removed or skipped selected by offset.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    ROWS_SINK,
    aggregate_table,
    below,
    count_rows,
    delete_records,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    pg_connect,
    positions,
    query,
    rows_contents,
    rows_truth,
    run_cli,
    sink_table,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration

DOUBLED = {
    "table": None,  # filled per pipeline
    "group_by": {"page": {"expr": "page", "type": "text"},
                 "minute": {"expr": "date_trunc('minute', timestamp)", "type": "timestamptz"}},
    "measures": {"views": {"expr": "1", "type": "bigint"},
                 "total_duration_ms": {"expr": "duration_ms * 2", "type": "bigint"}},
}


def _live_ranges(pipeline_name: str) -> list[tuple]:
    return query(
        "SELECT partition, from_offset, until_offset, kind FROM kafka_batch.live_ranges WHERE pipeline = %s"
        " ORDER BY partition, from_offset",
        pipeline_name,
    )


def test_replay_after_changing_the_aggregation(services):
    pipeline = new_pipeline("replay", rows=True)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 600, seed=21)
    run_cli("run", "--pipeline", pipeline.name)
    first_batch = positions(pipeline.name)
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=22)
    run_cli("run", "--pipeline", pipeline.name)
    committed = positions(pipeline.name)
    assert table_contents(pipeline) == ground_truth(topic)
    assert rows_contents(pipeline) == rows_truth(topic)

    rows = {**ROWS_SINK, "table": sink_table(pipeline, "rows")}
    update_pipeline(pipeline.name, sinks={"aggregate": {**DOUBLED, "table": aggregate_table(pipeline)}, "rows": rows})
    before = table_contents(pipeline)
    in_replayed = lambda p, o: p == 1 and o < first_batch[(topic, 1)]  # noqa: E731
    dry = run_cli("replay", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "1",
                  "--from", "3", "--until", "4", "--dry-run", "--run-id", "preview")
    assert f"{topic}[1] 0..{first_batch[(topic, 1)]}" in dry.stdout and "would recompute 1 committed range" in dry.stdout
    assert table_contents(pipeline) == before and positions(pipeline.name) == committed
    # The preview says, per key, what the replayed range adds now and what it would add.
    now, then = ground_truth(topic, select=in_replayed), ground_truth(topic, select=in_replayed, duration_factor=2)
    preview = query("SELECT p.group_key, p.before, p.after FROM kafka_batch.replay_previews p"
                    " JOIN kafka_batch.batches b ON b.id = p.batch_id WHERE b.pipeline = %s AND b.run_id = 'preview'"
                    " AND b.status = 'previewed'", pipeline.name)
    assert {(k["page"], datetime.fromisoformat(k["minute"])): ((b["views"], b["total_duration_ms"]),
                                                              (a["views"], a["total_duration_ms"]))
            for k, b, a in preview} == {key: (now[key], then[key]) for key in now}
    assert f"{len(now)} group key(s) would change" in dry.stdout

    # Offsets 3..4 of partition 1 widen to the whole first range of partition 1.
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "1", "--from", "3", "--until", "4")
    assert table_contents(pipeline) == merged(
        ground_truth(topic, select=lambda p, o: not in_replayed(p, o)),
        ground_truth(topic, select=in_replayed, duration_factor=2),
    )
    assert rows_contents(pipeline) == rows_truth(topic)  # the replayed range's rows swapped, none lost or doubled
    assert positions(pipeline.name) == committed  # a replay never moves a position

    # Everything, by time; then the schedule goes on with the new aggregation.
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic,
            "--from-time", "2000-01-01T00:00:00Z", "--until-time", "2100-01-01T00:00:00Z")
    assert table_contents(pipeline) == ground_truth(topic, duration_factor=2)
    sample_data.produce_page_views(kafka_config(), topic, 200, seed=23)
    run_cli("run", "--pipeline", pipeline.name)
    assert table_contents(pipeline) == ground_truth(topic, duration_factor=2)
    assert rows_contents(pipeline) == rows_truth(topic)
    # The ledger keeps every range: 2 batches x 3 partitions, 1 + 6 replayed (retired), 3 + 3 live.
    assert count_rows("SELECT count(*) FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b ON b.id = r.batch_id"
                      " WHERE b.pipeline = %s AND r.retired_at IS NOT NULL", pipeline.name) == 7
    assert [kind for *_, kind in _live_ranges(pipeline.name)].count("replay") == 6


def test_rewind_then_rerun_and_skip(services):
    pipeline = new_pipeline("rewind", partitions=2, rows=True)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 400, seed=31)
    run_cli("run", "--pipeline", pipeline.name)
    first = positions(pipeline.name)
    sample_data.produce_page_views(kafka_config(), topic, 200, seed=32)
    run_cli("run", "--pipeline", pipeline.name)
    second = positions(pipeline.name)

    inside = first[(topic, 0)] + 5  # inside the second range of partition 0
    shown = run_cli("reset", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "0",
                    "--to-offset", str(inside), "--reason", "bug fix")
    assert "dry run: nothing changed" in shown.stdout and "widened to its start" in shown.stdout
    assert positions(pipeline.name) == second

    run_cli("reset", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "0", "--to-offset", str(inside),
            "--reason", "bug fix", "--by", "alice", "--execute")
    rewound = {(topic, 0): first[(topic, 0)], (topic, 1): second[(topic, 1)]}
    assert positions(pipeline.name) == rewound
    assert table_contents(pipeline) == ground_truth(topic, select=below(rewound))
    assert rows_contents(pipeline) == rows_truth(topic, select=below(rewound))
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute("SELECT partition, from_position, to_position, direction, requested_by, reason"
                    " FROM kafka_batch.resets WHERE pipeline = %s", (pipeline.name,))
        assert cur.fetchall() == [(0, second[(topic, 0)], first[(topic, 0)], "rewind", "alice", "bug fix")]
    conn.close()

    run_cli("run", "--pipeline", pipeline.name)
    assert positions(pipeline.name) == second
    assert table_contents(pipeline) == ground_truth(topic)
    assert rows_contents(pipeline) == rows_truth(topic)

    # Skip forward: the skipped offsets are recorded and never counted.
    sample_data.produce_page_views(kafka_config(), topic, 200, seed=33)
    skip_to = second[(topic, 1)] + 20
    run_cli("reset", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "1", "--to-offset", str(skip_to),
            "--reason", "poison records", "--execute")
    run_cli("run", "--pipeline", pipeline.name)
    skipped = lambda p, o: p == 1 and second[(topic, 1)] <= o < skip_to  # noqa: E731
    assert table_contents(pipeline) == ground_truth(topic, select=lambda p, o: not skipped(p, o))
    assert rows_contents(pipeline) == rows_truth(topic, select=lambda p, o: not skipped(p, o))
    assert count_rows("SELECT count(*) FROM kafka_batch.resets WHERE pipeline = %s AND direction = 'skip'"
                      " AND from_position = %s AND to_position = %s", pipeline.name, second[(topic, 1)], skip_to) == 1


def test_invalid_operations_are_refused_and_change_nothing(services):
    pipeline = new_pipeline("badops", partitions=1)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 100, seed=41)
    run_cli("run", "--pipeline", pipeline.name)
    snapshot = (positions(pipeline.name), table_contents(pipeline), _live_ranges(pipeline.name))

    def refused(*args: str, message: str) -> None:
        result = run_cli(*args, check=False)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr
        assert (positions(pipeline.name), table_contents(pipeline), _live_ranges(pipeline.name)) == snapshot

    replay = ("replay", "--pipeline", pipeline.name, "--topic", topic)
    refused("replay", "--pipeline", "nope", "--topic", topic, "--from", "0", "--until", "1",
            message="unknown pipeline 'nope'")
    refused(*replay, "--partitions", "7", "--from", "0", "--until", "1", message="has not read")
    refused(*replay, "--from", "50", "--until", "10", message="from offset 50 must be >= 0 and below until offset 10")
    refused(*replay, "--from", "100", "--until", "200", message="no committed range")
    refused(*replay, "--from", "0", "--until", "10", "--from-time", "2026-01-01T00:00:00Z",
            "--until-time", "2026-01-02T00:00:00Z", message="not both")
    refused(*replay, "--from-time", "yesterday", "--until-time", "today", message="--from-time 'yesterday'")
    refused("reset", "--pipeline", pipeline.name, "--topic", topic, "--to-offset", "1000", "--reason", "x", "--execute",
            message="past the last stable offset")
    delete_records(topic, 0, 40)
    refused(*replay, "--from", "0", "--until", "100", message="beyond retention")
    refused("reset", "--pipeline", pipeline.name, "--topic", topic, "--to-offset", "10", "--reason", "x", "--execute",
            message="beyond retention")
    assert count_rows("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name) == 1
