"""Where a pipeline starts and which topics it reads, planned against the real broker and Postgres.

Expected offsets come from a plain consumer reading the topic, not from the planner.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime

import pytest

from kafka_batch.core import planning
from kafka_batch.errors import InputError
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    create_topic,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    records_by_partition,
    run_cli,
    store_connection,
    table_contents,
)

pytestmark = pytest.mark.integration


def _plan(pipeline, run_id: str):
    conn = store_connection()
    try:
        return planning.plan_batch(conn, KafkaOffsets(kafka_config()), pipeline, run_id)
    finally:
        conn.close()


def _end(records: list[tuple[int, int]]) -> int:
    return records[-1][0] + 1 if records else 0


def test_start_at_a_timestamp_uses_offsets_for_times(services):
    t0 = (int(time.time()) - 3600) * 1000  # recent: older records would fall to the topic's retention
    pipeline = new_pipeline("from_time", start={"timestamp": datetime.fromtimestamp((t0 + 60_000) / 1000, UTC).isoformat()})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=5, start_ms=t0, spacing_ms=1000)
    records = records_by_partition(topic)
    expected = {
        p: next((o for o, ts in rs if ts >= t0 + 60_000), _end(rs)) for p, rs in records.items()
    }
    assert 0 < sum(expected.values()) < 300  # the timestamp falls inside the data
    batch = _plan(pipeline, "r1")
    assert {r.partition: r.from_offset for r in batch.ranges} == expected
    assert {r.partition: r.until_offset for r in batch.ranges} == {p: _end(rs) for p, rs in records.items()}


def test_start_at_explicit_offsets_and_every_partition_must_be_given(services):
    topic = f"from_offsets_{uuid.uuid4().hex[:8]}"
    create_topic(topic, 2)
    sample_data.produce_page_views(kafka_config(), topic, 200, seed=6)
    ends = {p: _end(rs) for p, rs in records_by_partition(topic).items()}
    assert min(ends.values()) > 10
    missing = new_pipeline("from_offsets", partitions=0, topics=[topic], start={"offsets": {topic: {0: 3}}})
    with pytest.raises(InputError, match=rf"{topic}\[1\]: the start offsets give no offset for this partition"):
        _plan(missing, "r1")
    given = new_pipeline("from_offsets", partitions=0, topics=[topic], start={"offsets": {topic: {0: 3, 1: 10}}})
    batch = _plan(given, "r1")
    assert [(r.partition, r.from_offset, r.until_offset) for r in batch.ranges] == [(0, 3, ends[0]), (1, 10, ends[1])]


def test_topic_pattern_reads_every_matching_topic_including_new_ones(services):
    prefix = f"pat_{uuid.uuid4().hex[:8]}"
    for name, partitions in ((f"{prefix}.a", 2), (f"{prefix}.b", 1), (f"{prefix}_other", 1)):
        create_topic(name, partitions)
        sample_data.produce_page_views(kafka_config(), name, 50, seed=len(name) + partitions)
    pipeline = new_pipeline("pattern", partitions=0, topics={"pattern": rf"{re.escape(prefix)}\.[a-z]+"})
    run_cli("run", "--pipeline", pipeline.name)
    assert table_contents(pipeline) == merged(ground_truth(f"{prefix}.a"), ground_truth(f"{prefix}.b"))

    create_topic(f"{prefix}.c", 1)  # appears after the pipeline started: read from its start
    sample_data.produce_page_views(kafka_config(), f"{prefix}.c", 20, seed=9)
    batch = _plan(pipeline, "r2")
    assert [(r.topic, r.partition, r.from_offset, r.until_offset) for r in batch.ranges] == [(f"{prefix}.c", 0, 0, 20)]
