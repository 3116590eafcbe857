"""The reader's Arrow columns from confluent_kafka Messages built by hand (pure logic: no broker can be
made to send a record without a timestamp, and the column must still say so)."""

from __future__ import annotations

import datetime as dt

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message

from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.spark.json_fields import PARSED, JsonFields, field_column
from kafka_batch.spark.reader import BASE_COLUMNS, VALUE_BYTES, chunks_to_arrow, messages_to_arrow

RANGE = OffsetRange("t", 3, 0, 100, range_id=7)
WANTED = ("range_id", "topic", "partition", "offset", "timestamp", "timestamp_type")


def messages(timestamps):
    return [Message(topic="t", partition=3, offset=i, key=b"k", value=b"{}", timestamp=ts)
            for i, ts in enumerate(timestamps)]


def columns(timestamps, wanted=WANTED):
    return messages_to_arrow(messages(timestamps), RANGE, wanted).to_pydict()


def at(millis):
    return dt.datetime.fromtimestamp(millis / 1000, dt.UTC)


def test_timestamps_are_utc_microseconds_with_their_kinds():
    got = columns([(TIMESTAMP_CREATE_TIME, 1_700_000_000_123), (TIMESTAMP_LOG_APPEND_TIME, 1_700_000_001_000)])
    assert got["timestamp"] == [at(1_700_000_000_123), at(1_700_000_001_000)]
    assert got["timestamp_type"] == [TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME]
    assert got["range_id"] == [7, 7] and got["topic"] == ["t", "t"] and got["partition"] == [3, 3]
    assert got["offset"] == [0, 1]


def test_chunks_of_many_partitions_make_one_batch_each_record_with_its_own_range():
    def chunk(topic, partition, offsets, values):
        return [Message(topic=topic, partition=partition, offset=o, value=v, timestamp=(TIMESTAMP_CREATE_TIME, 1))
                for o, v in zip(offsets, values, strict=True)]

    chunks = [(OffsetRange("a", 0, 5, 9, range_id=11), chunk("a", 0, [5, 6], [b'{"page": "x"}', b'{"page": "y"}'])),
              (OffsetRange("b", 4, 0, 3, range_id=12), chunk("b", 4, [0], [b'{"page": "z"}'])),
              (OffsetRange("a", 0, 5, 9, range_id=11), chunk("a", 0, [7], [b'{"page": "w"}']))]
    got = chunks_to_arrow(chunks, BASE_COLUMNS, JsonFields({"page": "string"})).to_pydict()
    assert got["range_id"] == [11, 11, 12, 11]
    assert got["topic"] == ["a", "a", "b", "a"] and got["partition"] == [0, 0, 4, 0]
    assert got["offset"] == [5, 6, 0, 7]
    assert got[field_column("page")] == ["x", "y", "z", "w"] and got[PARSED] == [True] * 4


def test_offsets_keep_the_gaps_that_markers_and_compaction_leave():
    """A chunk's offsets are made without asking each record only when they have no gap."""
    def chunk(offsets):
        return [Message(topic="t", partition=3, offset=o, value=b"{}", timestamp=(TIMESTAMP_CREATE_TIME, 1))
                for o in offsets]

    def offsets(*chunks):
        return chunks_to_arrow([(RANGE, c) for c in chunks], ("offset",)).column("offset").to_pylist()

    assert offsets(chunk([3, 4, 5])) == [3, 4, 5]
    assert offsets(chunk([3, 5, 6])) == [3, 5, 6]  # a marker at 4
    assert offsets(chunk([3, 4]), chunk([9, 10, 11])) == [3, 4, 9, 10, 11]
    assert offsets(chunk([3, 4]), chunk([9, 11, 12])) == [3, 4, 9, 11, 12]
    assert offsets(chunk([0, 2, 3, 4]), chunk([7])) == [0, 2, 3, 4, 7]  # a gap in the first chunk only


@pytest.mark.parametrize("wanted", [("timestamp",), ("timestamp", "timestamp_type")])
@pytest.mark.parametrize("missing", [(TIMESTAMP_NOT_AVAILABLE, -1), (TIMESTAMP_NOT_AVAILABLE, 0)])
def test_a_record_without_a_timestamp_has_a_null_one(wanted, missing):
    got = columns([(TIMESTAMP_CREATE_TIME, 1_000), missing, (TIMESTAMP_CREATE_TIME, 2_000)], wanted)
    assert got["timestamp"] == [at(1_000), None, at(2_000)]


def test_a_timestamp_before_1970_is_kept():
    """-1 with a kind is a time (Kafka's NO_TIMESTAMP comes without one): only the kind says "none"."""
    got = columns([(TIMESTAMP_CREATE_TIME, -1), (TIMESTAMP_CREATE_TIME, 0)])
    assert got["timestamp"] == [at(-1), at(0)]


def test_an_empty_chunk_has_empty_columns():
    assert columns([]) == {name: [] for name in WANTED}


def chunk(values):
    return [Message(topic="t", partition=3, offset=i, key=None, value=v, timestamp=(TIMESTAMP_CREATE_TIME, 1_000))
            for i, v in enumerate(values)]


PAGE = JsonFields({"page": "string"})


def test_a_chunk_the_reader_parsed_ships_its_values_lengths_only_when_asked():
    values = [b'{"page": "/a"}', None, b'{"page": "/bc", "x": 1}']
    left_out = messages_to_arrow(chunk(values), RANGE, BASE_COLUMNS, PAGE, values="unparsed").to_pydict()
    assert left_out["value"] == [None, None, None]
    assert left_out[VALUE_BYTES] == [14, None, 23]  # a tombstone's is null
    assert left_out[PARSED] == [True, True, True] and left_out[field_column("page")] == ["/a", None, "/bc"]
    whole = messages_to_arrow(chunk(values), RANGE, BASE_COLUMNS, PAGE).to_pydict()
    assert whole["value"] == values and VALUE_BYTES not in whole


@pytest.mark.parametrize("decoder", [PAGE, None])
def test_values_not_parsed_in_the_reader_are_shipped_whole(decoder):
    """from_json parses them (and the quarantine keeps them): a chunk pyarrow refused, or no decoder."""
    values = [b'{"page": "/a"}', b"not json", None]
    got = messages_to_arrow(chunk(values), RANGE, BASE_COLUMNS, decoder, values="unparsed").to_pydict()
    assert got["value"] == values and got[VALUE_BYTES] == [14, 8, None]


def test_a_batch_leaves_values_out_only_where_a_json_decoder_parses_them_and_nothing_reads_them():
    from kafka_batch.config import PROJECT_ROOT, load_pipeline, parse_pipeline
    from kafka_batch.formats.columns import Decoded
    from kafka_batch.spark.job import _values

    pipeline = load_pipeline("page_views", PROJECT_ROOT / "pipelines")
    json_decoder = JsonFields(pipeline.fields)
    assert _values(pipeline, json_decoder) == "unparsed"
    assert _values(pipeline, None) == "all"  # from_json parses every value
    assert _values(pipeline, Decoded(None)) == "all"  # Avro and Protobuf: every value shipped anyway
    measures = pipeline.definition["sinks"]["aggregate"]["measures"]
    reading = parse_pipeline({**pipeline.definition, "sinks": {"aggregate": {
        **pipeline.definition["sinks"]["aggregate"],
        "measures": {**measures, "value_bytes": {"expr": "length(value)", "type": "bigint"}}}}})
    assert _values(reading, json_decoder) == "all"
