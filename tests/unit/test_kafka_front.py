"""The front's decision: which listed aborted transactions ended before a fetch (Apache Kafka lists only
the others). Logs are built with kio's record batch writer, not the front's reader."""

from __future__ import annotations

import asyncio
import datetime
import io
import random
import struct

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from kafka_batch_dev.kafka_front import (
    BrokerConnection,
    TransactionMarkers,
    cut_records,
    kafka_listing,
    placeholder_request,
    produce_producer,
    record_batches,
    refusal_answer,
    whole_batches,
)

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
TRANSACTIONAL, CONTROL = 0x10, 0x20


def batch(producer: int, offsets: range, marker: str | None = None) -> bytes:
    """Data records at `offsets`, or one transaction marker ("abort" / "commit") at offsets[0]."""
    key = None if marker is None else struct.pack(">hh", 0, {"abort": 0, "commit": 1}[marker])
    records = tuple(Record(attributes=i8(0), timestamp=T0, offset=i64(o), key=key, value=None if marker else b"v",
                           headers=()) for o in offsets)
    buffer = io.BytesIO()
    write_new_batch(buffer, NewRecordBatch(producer_id=i64(producer), producer_epoch=i16(0), base_sequence=i32(0),
                                           records=records,
                                           attributes=i16(TRANSACTIONAL | (CONTROL if marker else 0))))
    return buffer.getvalue()


# Producer 7: committed 0-2 (marker 3), aborted 4-5 (marker 6), committed 7 (marker 8).
# Producer 9, interleaved: aborted 9 (marker 10); producer 11: open from 11.
LOG = [batch(7, range(0, 3)), batch(7, range(3, 4), "commit"), batch(7, range(4, 6)), batch(7, range(6, 7), "abort"),
       batch(7, range(7, 8)), batch(7, range(8, 9), "commit"), batch(9, range(9, 10)),
       batch(9, range(10, 11), "abort"), batch(11, range(11, 13))]


def markers_from(start: int) -> TransactionMarkers:
    """The markers of LOG as read from `start` (the log start, after a deletion)."""
    known = TransactionMarkers(start)
    known.add(b"".join(b for b in LOG if next(record_batches(b))[1] >= start))
    return known


def test_the_log_is_walked_batch_by_batch_and_a_partial_batch_ends_it():
    whole = b"".join(LOG)
    walked = [(base, last, producer) for base, last, _, producer, _ in record_batches(whole + LOG[0][:30])]
    assert walked[0] == (0, 2, 7) and walked[-1] == (11, 12, 11) and len(walked) == len(LOG)
    known = markers_from(0)
    assert known.scanned_to == 13
    assert known.offsets == {7: [3, 6, 8], 9: [10]} and known.aborted == {7: [False, True, False], 9: [True]}


@pytest.mark.parametrize(("producer", "first", "fetch", "ended"), [
    (7, 4, 7, True),    # marker at 6: before the fetch, Apache Kafka would not list it
    (7, 4, 6, False),   # the fetch starts on its marker: it overlaps
    (7, 4, 5, False),   # the fetch starts inside it
    (9, 9, 10, False),
    (9, 9, 11, True),
    (11, 11, 13, False),  # open: no marker yet
])
def test_a_transaction_ends_at_its_producers_next_marker(producer, first, fetch, ended):
    known = markers_from(0)
    assert known.settles(producer, first, fetch)
    assert known.ended_before(producer, first, fetch, [first]) is ended


def test_what_is_not_read_yet_does_not_settle_an_open_transaction():
    known = TransactionMarkers(0)
    known.add(b"".join(LOG[:3]))  # up to offset 5: producer 7's abort marker not read yet
    assert not known.settles(7, 4, 7)
    assert known.settles(7, 0, 7)  # its commit marker at 3 is read
    known.add(b"".join(LOG[3:]))
    assert known.settles(7, 4, 7) and known.ended_before(7, 4, 7, [4])


@pytest.mark.parametrize(("start", "listed", "first", "fetch", "ended"), [
    (5, [4], 4, 7, True),       # began before the read log, its abort marker at 6 is the producer's first there
    (5, [4], 4, 6, False),
    (5, [0, 4], 0, 7, True),    # not the producer's latest transaction begun before the read log
    (7, [4], 4, 9, True),       # the producer's first marker in the read log commits: it ended before
    (4, [2, 4], 2, 7, True),    # a later listed transaction begins before the first marker in the read log
])
def test_a_transaction_begun_before_the_log_start(start, listed, first, fetch, ended):
    known = markers_from(start)
    assert known.settles(7, first, fetch)
    assert known.ended_before(7, first, fetch, listed) is ended


def answer(*batches: bytes) -> bytes:
    return b"".join(batches)


def test_a_listed_transaction_that_ended_before_the_fetch_is_dropped_where_the_producer_commits_later():
    # Producer 7 aborted 4-5 (marker 6), then committed 7 (marker 8); a fetch from 7 must not list its abort.
    kept, undecided = kafka_listing([(7, 4)], answer(batch(7, range(7, 8)), batch(7, range(8, 9), "commit")), 7)
    assert (kept, undecided) == ([], [])


def test_an_abort_marker_ends_the_latest_listed_transaction_before_it_and_later_ones_stay():
    kept, _ = kafka_listing([(7, 1), (7, 4), (7, 20)], answer(batch(7, range(6, 7), "abort"),
                                                             batch(7, range(7, 8)), batch(7, range(8, 9), "commit")), 5)
    assert kept == [(7, 4), (7, 20)]  # 1 ended before 4 began; 20 begins after the answer's last marker


def test_an_aborted_transaction_the_broker_did_not_list_is_listed_from_its_first_batch():
    # What noida answers once the log start lies inside an aborted transaction: its batch, no listing.
    kept, _ = kafka_listing([], answer(batch(9, range(6, 11)), batch(9, range(11, 12), "abort"),
                                       batch(9, range(12, 13))), 8)
    assert kept == [(9, 6)]


def test_a_producer_with_records_in_the_answer_and_no_marker_after_them_is_left_to_the_index():
    kept, undecided = kafka_listing([(5, 2), (7, 1), (7, 30)], answer(batch(7, range(10, 12)), batch(5, range(12, 13))), 10)
    assert kept == [(7, 30)] and sorted(undecided) == [(5, 2), (7, 1)]
    # Without records of the producer in the answer, a listing is harmless, and stays as it is.
    kept, undecided = kafka_listing([(5, 2)], answer(batch(7, range(10, 12))), 10)
    assert (kept, undecided) == ([(5, 2)], [])


def offsets_of(records: bytes) -> list[tuple[int, int]]:
    return [(base, last) for base, last, *_ in record_batches(records)]


def test_an_answer_is_cut_as_kafka_cuts_it_whole_batches_up_to_the_limit_and_at_least_one():
    whole, end = whole_batches(b"".join(LOG) + LOG[0][:30])  # a partial batch at the end is never given
    assert bytes(whole) == b"".join(LOG) and end == 13
    sizes = [len(b) for b in LOG]
    # From offset 5 (inside the batch 4-5): that batch on, as many as fit in the limit.
    given, rest, given_end = cut_records(whole, 5, sizes[2] + sizes[3] + 1)
    assert offsets_of(given) == [(4, 5), (6, 6)] and given_end == 7
    assert bytes(rest) == b"".join(LOG[4:])
    # A limit below the first batch still gives it, unless the fetch's bytes are spent on other partitions.
    assert offsets_of(cut_records(whole, 0, 1)[0]) == [(0, 2)]
    given, rest, given_end = cut_records(whole, 0, 1, at_least_one=False)
    assert (bytes(given), given_end) == (b"", 0) and bytes(rest) == b"".join(LOG)
    # Nothing at or after the offset: nothing to give or keep.
    assert [bytes(part) for part in cut_records(whole, 13, 100)[:2]] == [b"", b""]
    assert bytes(cut_records(whole, 0, 10**9)[0]) == b"".join(LOG)


def produce_request(version: int, transactional_id: str | None, records: bytes | None) -> bytes:
    """A Produce request frame (header and body) as a client writes it, by kio's writers."""
    from kio.index import load_request_schema
    from kio.serial import entity_writer

    schema = load_request_schema(0, version)
    module = __import__(schema.__module__, fromlist=["TopicProduceData"])
    request = schema(transactional_id=transactional_id, acks=i16(-1), timeout=i32Timedelta.parse(
        datetime.timedelta(seconds=30)), topic_data=(module.TopicProduceData(name="pages", partition_data=(
            module.PartitionProduceData(index=i32(3), records=records),)),))
    buffer = io.BytesIO()
    buffer.write(struct.pack(">hhih", 0, version, 41, 6) + b"client" + (b"\0" if schema.__flexible__ else b""))
    entity_writer(schema)(buffer, request)
    return buffer.getvalue()


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_a_produce_request_is_read_by_hand_to_its_transaction_and_producer(version):
    assert produce_producer(produce_request(version, "kafka-batch.p.out", batch(4711, range(5))), version) == (
        "kafka-batch.p.out", 4711, 0)
    assert produce_producer(produce_request(version, None, batch(12, range(1))), version) == (None, 12, 0)
    assert produce_producer(produce_request(version, "t", None), version) is None


def test_a_lost_transactions_request_is_refused_with_an_answer_kafka_clients_read_as_unknown_producer():
    from kio.index import load_request_schema, load_response_schema
    from kio.schema.errors import ErrorCode
    from kio.serial import entity_reader

    frame = produce_request(9, "t", batch(4711, range(5)))
    schema = load_request_schema(0, 9)
    request, _ = entity_reader(schema)(frame, 10 + 6 + 1)
    answer = refusal_answer(schema, request, ErrorCode.unknown_producer_id)
    response, _ = entity_reader(load_response_schema(0, 9))(answer, 1)  # after the header's tagged fields
    assert [(t.name, [(p.index, p.error_code) for p in t.partition_responses]) for t in response.responses] == [
        ("pages", [(3, ErrorCode.unknown_producer_id)])]
    # Sent in its place: an ApiVersions v0 request with its correlation id and no client id.
    assert struct.unpack(">hhih", placeholder_request(frame)) == (18, 0, 41, -1)


def test_a_broker_connection_reads_each_answer_whole_and_in_order_however_it_arrives():
    """Answers (their size, then their bytes) sent over a real socket in pieces that split sizes and
    bodies anywhere: each comes out whole, in order, the empty one too; a request written through the
    connection reaches the broker; once the broker closes, reading says so."""
    rng = random.Random(7)
    answers = [b"", b"abc", bytes(rng.randrange(256) for _ in range(70_000)), rng.randbytes(3 * 1024 * 1024)]
    stream = b"".join(struct.pack(">i", len(a)) + a for a in answers)
    received = []

    async def broker(reader, writer):
        received.append(await reader.readexactly(5))
        pos = 0
        while pos < len(stream):
            step = rng.choice((1, 3, 4, 5, 1000, 65_536, 1_000_000))
            writer.write(stream[pos:pos + step])
            await writer.drain()
            pos += step
        writer.close()

    async def main():
        server = await asyncio.start_server(broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            connection = await BrokerConnection.open("127.0.0.1", port)
            connection.writelines((b"hel", b"lo"))
            await connection.drain()
            frames = [bytes(await connection.read_frame()) for _ in answers]
            with pytest.raises(ConnectionError):
                await connection.read_frame()
            connection.close()
        return frames

    assert asyncio.run(main()) == answers
    assert received == [b"hello"]
