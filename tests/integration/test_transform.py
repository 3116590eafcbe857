"""The Spark transform on a local session with tiny fixtures (expectations written by hand).

Each test runs three times: on records as Spark's from_json parses them, on records whose fields the
reader parsed where it could (`json_fields`; each record its own chunk, so parsed and left ones mix), and
on those as a batch's read gives them, the values of parsed chunks left out (reader.VALUES "unparsed").
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from kafka_batch.config import PROJECT_ROOT, load_pipeline, parse_pipeline
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.sinks.base import StageContext
from kafka_batch.spark.json_fields import JsonFields, parse_values
from kafka_batch.spark.reader import ALL_COLUMNS, arrow_schema, messages_to_arrow, record_schema
from kafka_batch.spark.transform import invalid_records, parse_records

pytestmark = pytest.mark.integration
PIPELINE = load_pipeline("page_views", PROJECT_ROOT / "pipelines")


def record(offset, value, ts="2026-01-01T12:00:30", range_id=1):
    timestamp = datetime.fromisoformat(ts).replace(tzinfo=UTC)
    body = None if value is None else (value if isinstance(value, bytes) else json.dumps(value).encode())
    return (range_id, "pv", 0, offset, timestamp, 0, b"k", body, None)


@pytest.fixture(params=["from_json", "reader", "reader, parsed values left out"])
def records(spark, request):
    """rows, pipeline -> the records DataFrame the reader would give, with or without parsed fields."""
    def frame(rows, pipeline=PIPELINE):
        if request.param == "from_json":
            return spark.createDataFrame(rows, record_schema())
        if request.param == "reader, parsed values left out":
            decoder = JsonFields(pipeline.fields)
            return spark.createDataFrame(pa.Table.from_batches([messages_to_arrow(
                [Message(topic=topic, partition=partition, offset=offset, key=key, value=value,
                         timestamp=(TIMESTAMP_CREATE_TIME, int(timestamp.timestamp() * 1000)))],
                OffsetRange(topic, partition, 0, 10**9, range_id=range_id), ALL_COLUMNS, decoder, values="unparsed",
            ) for range_id, topic, partition, offset, timestamp, _, key, value, _ in rows]))
        schema = arrow_schema(ALL_COLUMNS, JsonFields(pipeline.fields))
        return spark.createDataFrame(pa.Table.from_batches([
            pa.RecordBatch.from_arrays(
                [pa.array([v], f.type) for v, f in zip(row, schema, strict=False)] + parse_values([row[7]], pipeline.fields),
                schema=schema,
            ) for row in rows
        ]))

    return frame


def run(records, rows, pipeline=PIPELINE):
    """The aggregate sink's Spark side over parsed records: (contributions, counts per range)."""
    [aggregate] = pipeline.sinks
    output = aggregate.compute(parse_records(records(rows, pipeline), pipeline), StageContext(1, 1, {}))
    return output.result, output.counts


FAILING = parse_pipeline({**PIPELINE.definition, "on_invalid_record": "fail"})


def test_aggregates_per_page_and_minute_and_counts_tombstones(records):
    rows = [
        record(0, {"user_id": "a", "page": "/", "duration_ms": 100}),
        record(1, {"user_id": "b", "page": "/", "duration_ms": 50}, ts="2026-01-01T12:00:59"),
        record(2, {"user_id": "a", "page": "/", "duration_ms": 7}, ts="2026-01-01T12:01:00"),
        record(3, None),
        record(4, {"user_id": "c", "page": "/cart", "duration_ms": 1, "extra": True}, range_id=2),
    ]
    contributions, counts = run(records, rows)
    got = {(r["range_id"], r["page"], r["minute"].isoformat()): (r["views"], r["total_duration_ms"])
           for r in contributions.to_pylist()}
    assert got == {
        (1, "/", "2026-01-01T12:00:00+00:00"): (2, 150),
        (1, "/", "2026-01-01T12:01:00+00:00"): (1, 7),
        (2, "/cart", "2026-01-01T12:00:00+00:00"): (1, 1),
    }
    assert (counts[1].records, counts[1].tombstones) == (3, 1)
    assert (counts[2].records, counts[2].tombstones) == (1, 0)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (b"not json", "user_id, page, duration_ms"),
        ({"user_id": "a", "page": "/"}, "duration_ms"),
        ({"user_id": "a", "page": "/", "duration_ms": "slow"}, "duration_ms"),
    ],
)
def test_under_fail_an_unparseable_record_is_named(records, value, named):
    rows = [record(0, {"user_id": "a", "page": "/", "duration_ms": 1}), record(17, value)]
    with pytest.raises(Exception, match=rf"invalid record pv\[0\] at offset 17 \(pipeline page_views\): not a JSON object.*mistyped: {named}"):
        run(records, rows, FAILING)


def test_invalid_records_are_counted_left_out_and_given_a_reason(records):
    small = PIPELINE.with_limits(max_value_bytes=200)
    oversized = {"user_id": "a", "page": "/" + "x" * 300, "duration_ms": 1}
    rows = [
        record(0, {"user_id": "a", "page": "/", "duration_ms": 5}),
        record(1, b"not json"),
        record(2, {"user_id": "a", "page": "/", "duration_ms": "slow"}),
        record(3, oversized),
        record(4, {"user_id": "a", "page": None, "duration_ms": 1}),
        record(5, None),
        record(6, {"user_id": "b", "page": "/", "duration_ms": 7}, range_id=2),
    ]
    contributions, counts = run(records, rows, small)
    assert {(r["range_id"], r["page"]): (r["views"], r["total_duration_ms"]) for r in contributions.to_pylist()} == {
        (1, "/"): (1, 5), (2, "/"): (1, 7)}
    assert (counts[1].records, counts[1].tombstones, counts[1].invalid) == (1, 1, 4)
    assert (counts[2].records, counts[2].invalid) == (1, 0)
    reasons = {r["offset"]: r["reason"] for r in
               invalid_records(parse_records(records(rows, small), small)).toArrow().to_pylist()}
    assert set(reasons) == {1, 2, 3, 4}
    assert "mistyped: user_id, page, duration_ms" in reasons[1] and "mistyped: duration_ms" in reasons[2]
    assert reasons[3] == f"value of {len(json.dumps(oversized))} bytes is over max_value_bytes 200"
    assert "mistyped: page" in reasons[4]


def test_a_null_group_key_is_invalid_for_the_aggregate(records):
    keyed = parse_pipeline({**PIPELINE.definition, "sinks": {"aggregate": {
        **PIPELINE.definition["sinks"]["aggregate"],
        "group_by": {"page": "page", "user": {"expr": "nullif(user_id, 'anonymous')", "type": "text"}}}}})
    rows = [record(0, {"user_id": "a", "page": "/", "duration_ms": 5}),
            record(1, {"user_id": "anonymous", "page": "/", "duration_ms": 5})]
    _, counts = run(records, rows, keyed)
    assert (counts[1].records, counts[1].invalid) == (1, 1)
    [reason] = [r["reason"] for r in invalid_records(
        parse_records(records(rows, keyed), keyed)).toArrow().to_pylist()]
    assert reason == "null key(s) aggregate.user"
