"""The decision an attempt of a Kafka-publishing batch takes from what Kafka and Postgres say."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from kafka_batch.errors import ServiceError
from kafka_batch.kafka.publish import Decision, Published, Publisher, _service_error, decide, transactional_id
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.sinks.kafka import _messages, in_input_order


def test_an_identity_round_trips_through_an_offsets_metadata():
    identity = Published(12, 3, "replay")
    assert Published.from_metadata(identity.metadata()) == identity
    assert Published.from_metadata("") is None and Published.from_metadata('{"other": 1}') is None
    assert len(identity.metadata()) < 100  # Kafka keeps 4096 bytes of metadata by default


def test_found_committed_or_blocked():
    assert decide(5, [], {5: "running"}) is Decision.PUBLISH
    assert decide(5, [Published(4, 1, "batch")], {5: "running"}) is Decision.PUBLISH  # batch 4 committed in Postgres
    assert decide(5, [Published(4, 1, "batch"), Published(5, 2, "batch")], {5: "running"}) is Decision.COMPLETE
    with pytest.raises(ServiceError, match=r"batch 4 is published to Kafka and not yet committed to Postgres \(running\)"):
        decide(5, [Published(4, 1, "batch")], {4: "running", 5: "running"})


def test_one_transactional_id_per_pipeline_and_topic():
    assert transactional_id("page_views", "totals") == "kafka-batch.page_views.totals"


def test_a_transaction_the_broker_lost_is_said_to_have_published_nothing():
    from confluent_kafka import KafkaError, KafkaException

    lost = KafkaException(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "unknown producer id", txn_requires_abort=True))
    assert str(_service_error("publishing batch 7 to 'out'", lost)) == (
        "publishing batch 7 to 'out': unknown producer id; nothing of the transaction is visible, a new attempt"
        " publishes the batch")
    down = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    assert str(_service_error("publishing batch 7 to 'out'", down)) == "publishing batch 7 to 'out': broker down"


def test_each_message_names_its_source_record_and_range_in_its_headers():
    # Two ranges of two topics; the source's name is joined from the range and the offset.
    batch = SimpleNamespace(pipeline="views", id=7, kind="replay", ranges=[
        OffsetRange("clicks", 3, 100, 200, range_id=11), OffsetRange("page.views", 0, 0, 50, range_id=12)])
    result = pa.table({"range_id": [12, 11, 12], "offset": [0, 199, 49], "_key": ["a", None, "c"],
                       "_value": ['{"n":1}', '{"n":2}', '{"n":3}']})
    fixed = [("kafka_batch.pipeline", "views"), ("kafka_batch.batch", "7"), ("kafka_batch.kind", "replay")]
    assert list(_messages(result, batch)) == [
        ("a", '{"n":1}', [*fixed, ("kafka_batch.source", "page.views:0:0"), ("kafka_batch.range", "page.views:0:0-50")]),
        (None, '{"n":2}', [*fixed, ("kafka_batch.source", "clicks:3:199"), ("kafka_batch.range", "clicks:3:100-200")]),
        ("c", '{"n":3}', [*fixed, ("kafka_batch.source", "page.views:0:49"), ("kafka_batch.range", "page.views:0:0-50")]),
    ]
    assert [headers for _, _, headers in _messages(result, batch, wanted=("batch", "source"))] == [
        [("kafka_batch.batch", "7"), ("kafka_batch.source", name)] for name in ("page.views:0:0", "clicks:3:199",
                                                                               "page.views:0:49")]
    assert [headers for _, _, headers in _messages(result, batch, wanted=("kind", "range"))][1] == [
        ("kafka_batch.kind", "replay"), ("kafka_batch.range", "clicks:3:100-200")]
    assert [headers for _, _, headers in _messages(result, batch, wanted=())] == [None] * 3
    assert [value for _, value, _ in _messages(result, batch, encode=str.upper, wanted=())] == [
        '{"N":1}', '{"N":2}', '{"N":3}']


def _rows(*records: tuple[int, int, int]) -> pa.Table:
    """(range id, partition, offset) rows of topic t, as the Kafka sink's result carries them."""
    return pa.table({"range_id": [r for r, _, _ in records], "partition": [p for _, p, _ in records],
                     "offset": [o for _, _, o in records]})


def _order(pieces) -> list[tuple[int, int]]:
    return [(p, o) for piece in pieces for p, o in zip(piece["partition"].to_pylist(), piece["offset"].to_pylist(),
                                                       strict=True)]


def test_rows_arriving_in_task_order_go_out_in_offset_order_per_partition():
    # One range per partition: the order of arrival is kept, as it is.
    tasks = [[OffsetRange("t", 0, 0, 2, range_id=1), OffsetRange("t", 1, 0, 2, range_id=2)],
             [OffsetRange("t", 0, 2, 4, range_id=1)]]
    arriving = [_rows((1, 0, 0), (2, 1, 0), (1, 0, 1), (2, 1, 1)), _rows((1, 0, 2), (1, 0, 3))]
    assert list(in_input_order(arriving, tasks)) == arriving
    # A replay of two batches: partition 0's later range (id 4) is read by the first task, its earlier
    # one (id 3) by the second; range 4's rows wait for range 3, partition 1's go out at once.
    tasks = [[OffsetRange("t", 0, 10, 20, range_id=4), OffsetRange("t", 1, 0, 5, range_id=5)],
             [OffsetRange("t", 0, 0, 10, range_id=3)]]
    arriving = [_rows((4, 0, 10), (5, 1, 0), (4, 0, 11), (5, 1, 1)), _rows((3, 0, 0), (3, 0, 9))]
    out = _order(in_input_order(arriving, tasks))
    assert out == [(1, 0), (1, 1), (0, 0), (0, 9), (0, 10), (0, 11)]
    # Its earlier range read first: nothing waits beyond its own task.
    tasks = [[OffsetRange("t", 0, 0, 10, range_id=3)], [OffsetRange("t", 0, 10, 20, range_id=4)],
             [OffsetRange("t", 0, 20, 30, range_id=6)]]
    arriving = [_rows((3, 0, 0)), _rows((4, 0, 10)), _rows(), _rows((6, 0, 29))]
    assert _order(in_input_order(iter(arriving), tasks)) == [(0, 0), (0, 10), (0, 29)]


def test_a_call_past_its_bound_ends_with_stuck_and_leaves_its_thread_behind():
    # A stand-in for a librdkafka call that ignores its timeout: it returns only when released.
    import threading
    import time

    from kafka_batch.kafka.bounded import Stuck, bounded

    released = threading.Event()
    started = time.monotonic()
    with pytest.raises(Stuck, match=r"send_offsets_to_transaction of t did not return within 0.3 s"):
        bounded(lambda: released.wait(60), 0.3, "send_offsets_to_transaction of t")
    assert time.monotonic() - started < 5
    assert any(t.name.startswith("kafka-batch bounded") and t.daemon for t in threading.enumerate())
    released.set()
    # Within its bound: its result, or its own error as it was raised.
    assert bounded(lambda: 7, 5, "a quick call") == 7
    with pytest.raises(ZeroDivisionError):
        bounded(lambda: 1 / 0, 5, "a failing call")


def test_a_pipelines_tasks_have_time_bounds_from_its_limits_or_its_own():
    from kafka_batch.config import parse_pipeline

    base = {"name": "p", "topics": ["t"], "record": {"fields": {"a": "long"}},
            "sinks": {"aggregate": {"table": "t", "group_by": {"a": "a"}, "measures": {"n": {"expr": "1", "type": "bigint"}}}}}
    assert parse_pipeline(base).task_timeouts() == {"plan": 360, "execute": 1600, "report": 360}
    small = parse_pipeline({**base, "limits": {"max_records_per_batch": 100_000}, "read": {"kafka_timeout_seconds": 10}})
    assert small.task_timeouts() == {"plan": 160, "execute": 610, "report": 160}
    own = parse_pipeline({**base, "timeouts": {"execute_seconds": 90}})
    assert own.task_timeouts()["execute"] == 90


@pytest.mark.parametrize("extra", [{"acks": "1"}, {"acks": "0"}, {"enable.idempotence": False}])
def test_a_connections_extra_cannot_weaken_the_sinks_producer(extra):
    # librdkafka refuses acks other than all beside idempotence: without the sink's own acks=all, a
    # connection with acks=1 failed every publish (as a retried error) instead of publishing acks=all.
    Publisher({"bootstrap.servers": "127.0.0.1:9", **extra}, "p", "t", timeout=1)  # created: it never connects
