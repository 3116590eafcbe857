"""A front for the local broker whose fetch answers are what Apache Kafka answers.

noida-db lists, in every `read_committed` fetch response, the aborted transactions that ended before
the fetch offset; Apache Kafka lists only those that overlap the fetched records (KIP-98). librdkafka
skips a producer's record batches from the first offset of each listed aborted transaction until it
meets that producer's abort marker, so a listed transaction whose marker lies before the fetch offset
makes it drop every later batch of that producer: committed records silently lost.

`kafka-batch local up` therefore runs noida on an internal port and this front on the public one. The
front relays every request and response unchanged but for three answers:
- Fetch (`read_committed`): the list of aborted transactions is the one Apache Kafka gives, read off
  the answer's own markers (kafka_listing); the rare listed transaction the answer cannot place is
  placed by an index of each producer's markers (TransactionMarkers), read from the partition's log
  (`read_uncommitted`) once and then only what was appended, and extended by the answers that pass.
  A topic without aborts costs nothing but the relay, and no read costs the whole log.
- Metadata, FindCoordinator, DescribeCluster: the broker's address is the front's, so clients stay on it,
  and so is the cluster id (noida's with `-front`).
- ApiVersions: Fetch at most v12 (v13 names topics by id, and noida's ids are all zero).

And it answers fetches in Kafka's measure:
- At most the bytes a fetch asks for. noida-db answers with a partition's whole backlog from the fetch
  offset (100 MB for 1M records), and the client holds it all: a reader's memory grew with the backlog
  where Kafka bounds it by the consumer's settings. The front answers at most `partition_max_bytes` a
  partition and `max_bytes` in all (whole batches, at least one), and keeps the rest for the
  connection's next fetches there (Backlog), so the broker is asked for a backlog once, not per answer.
- Held when it finds nothing. noida-db answers such a fetch at once, where Kafka holds it up to the
  request's `max_wait` for records to arrive (a long poll). A consumer at a partition's end then asked
  again at once, thousands of times a second for as long as it stayed assigned, which took the CPU of
  two cores from the reads beside it. The front asks the broker again every FETCH_POLL_S until
  records arrive or the wait is over (FetchWait).

And a transaction open when the broker restarts fails as on Kafka, never silently (Transactions).
noida-db aborts it at its restart (ABORT markers), then acknowledges its commit and applies the
offsets sent in it (a batch recorded as published that no reader sees), and appends the records its
producer sends after the restart with no marker ever to end them (every `read_committed` reader of
the partition stops below them for good). Apache Kafka keeps such a transaction across a restart. The
front keeps the open transactions in a file (`kafka-batch local` starts it with the broker); those
open at its start are lost, and their producer is answered UNKNOWN_PRODUCER_ID ("the broker lost
track of this producer"), which librdkafka makes an abortable error: nothing more of the transaction
reaches the broker, its commit fails, the producer aborts and may begin again.

The index lives in memory; it is dropped when the broker closes a connection (a restarted broker may
have lost unflushed writes, and offsets could then name other records).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import dataclasses
import datetime
import functools
import io
import json
import logging
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.index import load_request_schema as _load_request_schema
from kio.index import load_response_schema as _load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_signed_varint, read_unsigned_varint
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

LOG = logging.getLogger("kafka_batch_dev.kafka_front")
# kio resolves a schema's module by name on every call; a relay asks hundreds of times a second.
load_request_schema = functools.cache(_load_request_schema)
load_response_schema = functools.cache(_load_response_schema)

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS = 0, 1, 3, 10, 18, 19, 20, 21
DESCRIBE_CLUSTER = 60
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
TRANSACTION_APIS = (INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT)
LOG_CHANGES = (CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS)  # after them a kept backlog may not be the log
ADDRESS_ANSWERS = (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER)
FRONT_CLUSTER_SUFFIX = "-front"
FETCH_MAX_VERSION = 12
READ_COMMITTED = 1
# What a client's connection buffers before it stops reading: a producer's request may hold megabytes,
# and a small buffer would pause and resume the socket every 128 kB of it. (The broker's answers, a
# whole backlog each, are read by BrokerConnection.)
STREAM_LIMIT = 16 * 1024 * 1024
OFFSET_OUT_OF_RANGE = 1
# How often a held fetch asks the broker again: what records that arrive meanwhile wait at most.
FETCH_POLL_S = 0.02
NO_FETCH_SESSION = -1  # a fetch outside a session (KIP-227), as librdkafka sends: asking again is harmless

# A v2 record batch header (the Kafka message format): base offset, batch length, leader epoch, magic,
# crc, attributes, last offset delta, base and max timestamps, producer id and epoch, base sequence, count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
TRANSACTIONAL, CONTROL = 0x10, 0x20
ABORT_MARKER = 0


def record_batches(records: bytes | memoryview) -> Iterator[tuple[int, int, int, int, bytes | memoryview]]:
    """(base offset, last offset, attributes, producer id, the batch's records) of each whole batch."""
    for pos, stop, base, last, attributes, producer_id in _batch_spans(records):
        yield base, last, attributes, producer_id, records[pos + BATCH_HEADER.size:stop]


def _batch_spans(records: bytes | memoryview) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(start, stop, base offset, last offset, attributes, producer id) of each whole batch."""
    pos, end = 0, len(records)
    while pos + BATCH_HEADER.size <= end:
        base, length, _, magic, _, attributes, last_delta, _, _, producer_id, *_ = BATCH_HEADER.unpack_from(records, pos)
        stop = pos + 12 + length
        if stop > end or magic != 2:
            return  # a partial batch at the end of a response, or a format before transactions
        yield pos, stop, base, base + last_delta, attributes, producer_id
        pos = stop


def whole_batches(records: bytes | memoryview) -> tuple[memoryview, int]:
    """The answer's whole batches (a partial one at its end dropped: the client asks for it again) and
    the offset after the last one (-1 if there is none)."""
    view, whole, end = memoryview(records), 0, -1
    for _, stop, _, last, _, _ in _batch_spans(view):
        whole, end = stop, last + 1
    return view[:whole], end


def cut_records(records: bytes | memoryview, fetch_offset: int, limit: int, at_least_one: bool = True
                ) -> tuple[bytes | memoryview, bytes | memoryview, int]:
    """Whole batches (whole_batches) cut as Kafka cuts an answer: (those from the one holding
    `fetch_offset` on, up to `limit` bytes, at least one if `at_least_one`; the batches after them; the
    offset after the given ones). Walks only the batches it gives, and slices of a memoryview are
    views: cutting a kept backlog again and again copies nothing and walks it once."""
    first = split = None
    given_end = fetch_offset
    for pos, stop, _, last, _, _ in _batch_spans(records):
        if last < fetch_offset:
            continue
        if first is None:
            first = pos
            if not at_least_one and stop - first > limit:
                split = pos
                break
        elif stop - first > limit:
            split = pos
            break
        given_end = last + 1
    if first is None:
        return records[:0], records[:0], fetch_offset
    split = len(records) if split is None else split
    return records[first:split], records[split:], given_end


def control_type(body: bytes | memoryview) -> int:
    """The type of a control batch's record (0 abort, 1 commit), from its key (version, type)."""
    pos = read_signed_varint(body, 0)[1] + 1  # the record's length, then its attributes
    for _ in range(3):  # timestamp delta, offset delta, key length
        pos += read_signed_varint(body, pos)[1]
    return struct.unpack_from(">h", body, pos + 2)[0]


def kafka_listing(listed: list[tuple[int, int]], records: bytes | memoryview, fetch_offset: int
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The aborted transactions (producer id, first offset) Apache Kafka would list for a read_committed
    answer from `fetch_offset` holding `records`, as far as the answer itself shows: (listed, undecided).

    librdkafka pairs a producer's listed transactions with its abort markers in order. Walking the
    answer's batches as it does: at a producer's marker, every listed transaction of that producer that
    began before it has ended, so all but the latest are stale (ended before the fetch), and a commit
    ends none that is listed; at an abort, the latest is the one it ends, begun no later than the
    producer's first batch since its previous marker (noida neither lists nor filters an aborted
    transaction that began below the log start). What is listed after a producer's last marker in the
    answer stays, but one that began before the fetch offset, of a producer whose batches are in the
    answer without a marker after them, is `undecided`: whether it ended before the fetch offset is in
    the log before it (TransactionMarkers).
    """
    pending: dict[int, list[int]] = {}
    for producer_id, first in sorted(listed):
        pending.setdefault(producer_id, []).append(first)
    runs: dict[int, int] = {}  # producer id -> its first batch since its last marker in the answer
    kept: list[tuple[int, int]] = []
    for base, last, attributes, producer_id, body in record_batches(records):
        if last < fetch_offset or not attributes & TRANSACTIONAL:
            continue
        if not attributes & CONTROL:
            runs.setdefault(producer_id, base)
            continue
        firsts = pending.get(producer_id, [])
        ended = [f for f in firsts if f <= base]
        pending[producer_id] = firsts[len(ended):]
        starts = ended[-1:] + [runs.pop(producer_id)] if producer_id in runs else ended[-1:]
        if control_type(body) == ABORT_MARKER and starts:
            kept.append((producer_id, min(starts)))
    undecided = []
    for producer_id, firsts in pending.items():
        for first in firsts:  # begun before the fetch: the producer has no marker in the answer
            (undecided if first < fetch_offset and producer_id in runs else kept).append((producer_id, first))
    return kept, undecided


@dataclass
class TransactionMarkers:
    """Each producer's transaction markers in one partition's log, read from `scanned_from` on."""

    scanned_from: int
    scanned_to: int = -1
    offsets: dict[int, list[int]] = field(default_factory=dict)  # producer id -> marker offsets, ascending
    aborted: dict[int, list[bool]] = field(default_factory=dict)  # producer id -> abort (True) or commit

    def __post_init__(self) -> None:
        if self.scanned_to < 0:
            self.scanned_to = self.scanned_from

    def add(self, records: bytes | memoryview) -> None:
        """Take in the batches of a read_uncommitted read from `scanned_to`."""
        for base, last, attributes, producer_id, body in record_batches(records):
            if last < self.scanned_to:
                continue
            if attributes & CONTROL and base >= self.scanned_to:
                self.offsets.setdefault(producer_id, []).append(base)
                self.aborted.setdefault(producer_id, []).append(control_type(body) == ABORT_MARKER)
            self.scanned_to = last + 1

    def settles(self, producer_id: int, first_offset: int, fetch_offset: int) -> bool:
        """Whether what is read of the log says where that aborted transaction ended, relative to the
        fetch offset: a marker of its producer after its start, or the log read up to the fetch offset."""
        if self.scanned_to >= fetch_offset:
            return True
        offsets = self.offsets.get(producer_id, ())
        return first_offset >= self.scanned_from and bisect.bisect_right(offsets, first_offset) < len(offsets)

    def ended_before(self, producer_id: int, first_offset: int, fetch_offset: int, listed: list[int]) -> bool:
        """Whether the aborted transaction of `producer_id` that began at `first_offset` ended before
        `fetch_offset` (given `settles`). `listed`: the first offsets of every aborted transaction of
        that producer the answer lists.

        A producer's transactions follow one another, so the first marker after a transaction's start
        ends it. One that began before the read log (records deleted below it) can still have been
        open there only if it is the producer's latest such one and no later listed one starts before
        the producer's first marker, an abort, in the read log.
        """
        offsets = self.offsets.get(producer_id, [])
        if first_offset >= self.scanned_from:
            i = bisect.bisect_right(offsets, first_offset)
            return i < len(offsets) and offsets[i] < fetch_offset
        if first_offset != max(f for f in listed if f < self.scanned_from):
            return True
        if not offsets:
            return False  # still open at the end of the read log
        end = offsets[0]
        if not self.aborted[producer_id][0] or any(self.scanned_from <= f < end for f in listed):
            return True  # it ended before the read log began
        return end < fetch_offset


class MarkerIndex:
    """Transaction markers per partition, read from the broker on demand through one connection."""

    def __init__(self, host: str, port: int):
        self._address = (host, port)
        self._lock = asyncio.Lock()
        self._connection: BrokerConnection | None = None
        self._correlation = 0
        self.partitions: dict[tuple[str, int], TransactionMarkers] = {}

    def forget(self, topics: set[str] | None = None) -> None:
        """Drop what is known of these topics (all, if None)."""
        self.partitions = {tp: m for tp, m in self.partitions.items() if topics is not None and tp[0] not in topics}

    def _entry(self, topic: str, partition: int, log_start: int) -> TransactionMarkers | None:
        """What is known of a partition's log, if it is still that log (one that now begins earlier is
        another one: the topic was made anew)."""
        known = self.partitions.get((topic, partition))
        if known is not None and known.scanned_from > log_start:
            del self.partitions[(topic, partition)]
            return None
        return known

    async def markers(self, topic: str, partition: int, log_start: int, fetch_offset: int,
                      aborted: list[tuple[int, int]]) -> TransactionMarkers:
        """The markers of a partition, read far enough to say where each of the `aborted`
        transactions (producer id, first offset) that began before `fetch_offset` ended."""
        async with self._lock:
            key = (topic, partition)
            known = self._entry(topic, partition, log_start)
            if known is None:
                known = self.partitions[key] = TransactionMarkers(log_start)
            while not all(known.settles(producer, first, fetch_offset) for producer, first in aborted):
                records, log_start_now = await self._read(topic, partition, known.scanned_to)
                if records is None:  # below the log start now: read from there
                    known = self.partitions[key] = TransactionMarkers(log_start_now)
                    continue
                before = known.scanned_to
                known.add(records)
                if known.scanned_to == before:
                    LOG.warning("%s[%d]: the log read at %d gave no batch, wanted up to %d", topic, partition,
                                before, fetch_offset)
                    break
            return known

    def learn(self, topic: str, partition: int, log_start: int, fetch_offset: int, records: bytes | None) -> None:
        """Take in what a read_committed answer holds (it holds the markers too) where it continues what
        is known, or starts at the log start: a reader that goes through the log keeps the index
        current at no cost but walking the batch headers."""
        if not records:
            return
        known = self._entry(topic, partition, log_start)
        if known is None and fetch_offset <= log_start:
            known = self.partitions[(topic, partition)] = TransactionMarkers(log_start)
        if known is not None and known.scanned_from <= fetch_offset <= known.scanned_to:
            known.add(records)

    async def _read(self, topic: str, partition: int, offset: int) -> tuple[bytes | None, int]:
        """One read_uncommitted fetch of a partition from `offset`: (records, log start), records None
        when `offset` is below the log start."""
        if self._connection is None:
            self._connection = await BrokerConnection.open(*self._address)
        connection = self._connection
        self._correlation += 1
        try:
            await _write_frame(connection, fetch_request(topic, partition, offset, self._correlation))
            frame = await connection.read_frame()
        except OSError:
            self._connection = None
            raise
        response, _ = entity_reader(FetchResponse)(frame, _header_size(frame, flexible=True))
        data = response.responses[0].partitions[0]
        if data.error_code.value == OFFSET_OUT_OF_RANGE:
            return None, data.log_start_offset
        if data.error_code.value:
            raise OSError(f"{topic}[{partition}]: the broker answered error {data.error_code.name} to a log read")
        return data.records or b"", data.log_start_offset


def fetch_request(topic: str, partition: int, offset: int, correlation: int, partition_max_bytes: int = 2**31 - 1,
                  isolation_level: int = 0, client_id: str = "kafka-batch-front") -> bytes:
    """A Fetch v12 of one partition that does not wait (read_uncommitted unless `isolation_level` 1), framed
    without its size."""
    request = FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), isolation_level=i8(isolation_level),
        forgotten_topics_data=(), topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
            partition=i32(partition), fetch_offset=i64(offset), partition_max_bytes=i32(partition_max_bytes)),)),))
    buffer = io.BytesIO()
    entity_writer(RequestHeader)(buffer, RequestHeader(
        request_api_key=i16(FETCH), request_api_version=i16(12), correlation_id=i32(correlation), client_id=client_id))
    entity_writer(FetchRequest)(buffer, request)
    return buffer.getvalue()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


class BrokerConnection(asyncio.BufferedProtocol):
    """A connection to the broker: each answer read straight into a buffer of its size, where a
    StreamReader copies it through its own buffer twice more (an answer of noida-db holds a whole
    backlog, 100 MB and more). One reader at a time; writes as a StreamWriter's: `writelines`, then
    `drain`."""

    def __init__(self) -> None:
        self._size = bytearray(4)
        self._frame: bytearray | None = None  # the answer being read, once its size is known
        self._filled = 0
        self._answers: collections.deque[bytearray] = collections.deque()
        self._arrived: asyncio.Future | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = False
        self.transport: asyncio.Transport | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> BrokerConnection:
        _, connection = await asyncio.get_running_loop().create_connection(cls, host, port)
        return connection

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._size if self._frame is None else self._frame)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._frame is None:
            if self._filled < len(self._size):
                return
            self._frame, self._filled = bytearray(struct.unpack(">i", self._size)[0]), 0
        if self._filled == len(self._frame):
            self._answers.append(self._frame)
            self._frame, self._filled = None, 0
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._writable.set()
        self._wake()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    async def read_frame(self) -> memoryview:
        """The next answer (without its size), read-only as kio's readers take it; ConnectionError once
        the broker closed the connection."""
        while not self._answers:
            if self._lost:
                raise ConnectionResetError("the broker closed the connection")
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        return memoryview(self._answers.popleft()).toreadonly()

    def writelines(self, chunks) -> None:
        self.transport.writelines(chunks)

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the broker closed the connection")
        await self._writable.wait()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _write_frame(writer: asyncio.StreamWriter | BrokerConnection, payload: bytes | memoryview) -> None:
    writer.writelines((struct.pack(">i", len(payload)), payload))  # no copy of a 100 MB answer
    await writer.drain()


def _header_size(frame: bytes, flexible: bool) -> int:
    """The size of a response header: the correlation id, and tagged fields in a flexible one."""
    if not flexible:
        return 4
    tagged, size = read_unsigned_varint(frame, 4)
    if tagged:
        raise ValueError("tagged fields in a response header")  # none of the broker's answers has any
    return 4 + size


def _request_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request."""
    return struct.unpack_from(">hhi", frame, 0)


def _request_body_offset(frame: bytes, flexible: bool) -> int:
    """Where a request's body starts: after key, version, correlation id, client id (and tags)."""
    (client_id_size,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(client_id_size, 0)
    if flexible:
        pos += 1  # no tagged fields in the clients' request headers (librdkafka writes none)
    return pos


def as_front(entity, host: str, port: int):
    """The entity with the broker's address and cluster id replaced by the front's, wherever they are in it.

    Clients then connect to the front only; and its own cluster id keeps the verdict of a transactional
    check (`kafka-batch check-kafka`) on the front apart from one on noida itself, whose answers differ.
    """
    if isinstance(entity, tuple):
        return tuple(as_front(item, host, port) for item in entity)
    if not dataclasses.is_dataclass(entity):
        return entity
    changes = {}
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if f.name == "host" and value:
            changes.update(host=host, port=i32(port))
        elif f.name == "cluster_id" and value:
            changes["cluster_id"] = value + FRONT_CLUSTER_SUFFIX
        elif isinstance(value, tuple) or dataclasses.is_dataclass(value):
            replaced = as_front(value, host, port)
            if replaced != value:
                changes[f.name] = replaced
    return dataclasses.replace(entity, **changes) if changes else entity


@dataclass(frozen=True)
class PendingRequest:
    api_key: int
    version: int
    fetch_offsets: dict[tuple[str, int], int] | None = None  # a fetch: where each partition starts
    read_committed: bool = False
    limits: dict[tuple[str, int], int] = field(default_factory=dict)  # a fetch: the bytes each partition may take
    max_bytes: int = 2**31 - 1  # a fetch: the bytes its answer may take in all
    wait_s: float = 0.0  # a fetch Kafka would hold this long for records to arrive
    frame: bytes = b""  # such a fetch, to ask again
    answer: bytes | None = None  # the front's own answer (its body), given in the broker's answer's place
    ends: str | None = None  # the transactional id whose open transaction this request ends, answered without error


@dataclass
class Backlog:
    """What a connection was last answered for a partition: the batches the fetch could not take (none, at
    the partition's end). `answer`: the broker's answer (its offsets, its aborted transactions) with
    those batches as its records, [start, end) their offsets; `log_end` the partition's end it gave."""

    response: Any
    topic: Any
    answer: Any
    start: int
    end: int
    log_end: int
    version: int
    read_committed: bool
    generation: int

    def current(self, request: PendingRequest, generation: int) -> bool:
        return (self.version, self.read_committed, self.generation) == (request.version, request.read_committed,
                                                                        generation)

    def holds(self, offset: int) -> bool:
        return self.start <= offset < self.end

    def at_end(self, offset: int) -> bool:
        """Nothing is kept, and the client is where the partition ended: an empty answer is Kafka's too."""
        return offset == self.start == self.end and offset >= self.log_end


@dataclass
class Link:
    """One client's connection through the front: its requests in flight to the broker, in order, and
    what it was answered beyond what it asked."""

    client: asyncio.StreamWriter
    broker: BrokerConnection
    fetch_wait: FetchWait
    pending: dict[int, PendingRequest] = field(default_factory=dict)  # by correlation id
    backlogs: dict[tuple[str, int], Backlog] = field(default_factory=dict)
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


def _with_correlation(frame: bytes | memoryview, correlation: int, at: int) -> bytes:
    return b"".join((frame[:at], struct.pack(">i", correlation), frame[at + 4:]))


class FetchWait:
    """Kafka's long poll for one client connection: a fetch that finds nothing is asked again, on a
    connection of its own, until records (or an error) come or the request's wait is over."""

    def __init__(self, address: tuple[str, int]):
        self._address = address
        self._connection: BrokerConnection | None = None
        self._correlation = 0

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def answer(self, frame: bytes, response: Any, request: PendingRequest, read: Callable[[bytes], Any]
                     ) -> tuple[bytes, Any]:
        """The answer (frame, as `read` reads it) to give for `request`, whose broker's answer `frame` found
        nothing: a later one with records or an error, else the last when the wait is over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.wait_s
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(FETCH_POLL_S, left))
            try:
                again = await self._ask(request.frame)
            except OSError:
                self.close()
                break  # the broker's first answer stands; the client's own connection meets the fault
            frame = _with_correlation(again, struct.unpack_from(">i", frame, 0)[0], 0)
            response = read(frame)
            if response is None or not _nothing_fetched(response):
                break
        return frame, response

    async def _ask(self, request_frame: bytes) -> bytes:
        if self._connection is None:
            self._connection = await BrokerConnection.open(*self._address)
        connection = self._connection
        self._correlation += 1
        await _write_frame(connection, _with_correlation(request_frame, self._correlation, 4))
        return await connection.read_frame()


def _nothing_fetched(response) -> bool:
    """Whether a fetch answer holds no records and no error: the answer Kafka would have held."""
    if getattr(response, "error_code", None):  # a whole-request error (v7 on)
        return False
    return all(not data.records and not data.error_code.value for topic in response.responses for data in topic.partitions)


class Transactions:
    """The broker's open transactions (transactional id: producer id and epoch), kept in `path` across
    restarts. The front starts with the broker (`kafka-batch local` starts and stops them together), so a
    transaction open at its start was aborted by the broker's restart: lost, until its producer aborts it
    or bumps its epoch (one that never comes back leaves its entry, a few bytes). A lost transaction's
    requests never reach the broker: the front answers them UNKNOWN_PRODUCER_ID (an abort: done) in the
    place of the broker's answer to an ApiVersions request sent instead, so answers keep their order."""

    def __init__(self, path: Path | None):
        self._path = path
        saved = json.loads(path.read_text()) if path is not None and path.exists() else {}
        self.open: dict[str, tuple[int, int]] = {}
        aborted = {(tid, *producer) for tid, producer in saved.get("open", {}).items()}
        self.lost: set[tuple[str, int, int]] = aborted | {tuple(entry) for entry in saved.get("lost", ())}
        if aborted:
            LOG.warning("transactions open when the broker stopped, which its restart aborted: %s", sorted(aborted))
            self._save()

    def concerns(self, api_key: int, frame: bytes, version: int) -> bool:
        """Whether the request is read here: a transaction's, or records of a lost transaction (a Produce is
        read by hand, to its first batch's producer: the front never parses the records it relays)."""
        if api_key in TRANSACTION_APIS:
            return True
        if api_key != PRODUCE or not self.lost:
            return False
        try:
            return produce_producer(frame, version) in self.lost
        except Exception:  # noqa: BLE001 - a request the front cannot read is relayed as it is
            LOG.warning("could not read a Produce request v%d: relayed as it is", version, exc_info=True)
            return False

    def request(self, frame: bytes, api_key: int, version: int) -> tuple[bytes, PendingRequest]:
        """The request to send the broker (an ApiVersions in a refused one's place) and what its answer is."""
        try:
            schema = load_request_schema(api_key, version)
            request, _ = entity_reader(schema)(frame, _request_body_offset(frame, schema.__flexible__))
        except Exception:  # noqa: BLE001 - a request the front cannot read is relayed as it is
            LOG.warning("could not read a request to api %d v%d: relayed as it is", api_key, version, exc_info=True)
            return frame, PendingRequest(api_key, version)
        if api_key == PRODUCE:  # (read here only as a lost transaction's: concerns)
            read = produce_producer(frame, version)
            transactional_id, producer = read[0], read[1:]
        else:
            transactional_id, producer = _transaction_of(request)
        if transactional_id is None:
            return frame, PendingRequest(api_key, version)
        lost = (transactional_id, *producer)
        if api_key == INIT_PRODUCER_ID and lost in self.lost:  # its producer moves to a new epoch (KIP-360)
            self.lost.discard(lost)
            self._save()
        elif lost in self.lost:
            aborting = api_key == END_TXN and not request.committed
            if aborting:  # the broker's restart aborted it already
                self.lost.discard(lost)
                self._save()
            else:
                LOG.warning("%s (producer %d, epoch %d): its transaction was aborted by the broker's restart;"
                            " api %d v%d answered UNKNOWN_PRODUCER_ID", *lost, api_key, version)
            error = ErrorCode.none if aborting else ErrorCode.unknown_producer_id
            answer = refusal_answer(schema, request, error)
            return placeholder_request(frame), PendingRequest(api_key, version, answer=answer)
        if api_key in (ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN) and self.open.get(transactional_id) != producer:
            self.open[transactional_id] = producer  # saved before the broker can begin it
            self._save()
        ends = api_key in (INIT_PRODUCER_ID, END_TXN) and transactional_id in self.open
        return frame, PendingRequest(api_key, version, ends=transactional_id if ends else None)

    def answered(self, frame: bytes, request: PendingRequest) -> None:
        """An EndTxn or InitProducerId answered without error: its id has no transaction open any more."""
        schema = load_response_schema(request.api_key, request.version)
        response, _ = entity_reader(schema)(frame, _header_size(frame, schema.__flexible__))
        if response.error_code == ErrorCode.none and self.open.pop(request.ends, None) is not None:
            self._save()

    def _save(self) -> None:
        if self._path is not None:
            partial = self._path.with_suffix(".partial")
            partial.write_text(json.dumps({"open": self.open, "lost": sorted(self.lost)}))
            partial.replace(self._path)


def produce_producer(frame: bytes, version: int) -> tuple[str | None, int, int] | None:
    """(transactional id, producer id, epoch) of a Produce request, read by hand up to its first record
    batch's header; None without records."""
    flexible = load_request_schema(PRODUCE, version).__flexible__

    def length(pos: int, width: int) -> tuple[int, int]:
        """A string's, bytes' or array's length (-1: null) and where what it measures starts."""
        if flexible:  # stored plus one
            value, size = read_unsigned_varint(frame, pos)
            return value - 1, pos + size
        return struct.unpack_from(">h" if width == 2 else ">i", frame, pos)[0], pos + width

    size, pos = length(_request_body_offset(frame, flexible), 2)
    transactional_id = None if size < 0 else bytes(frame[pos:pos + size]).decode()
    topics, pos = length(pos + max(size, 0) + 6, 4)  # after acks and timeout
    if topics < 1:
        return None
    name, pos = length(pos, 2)
    partitions, pos = length(pos + name, 4)
    if partitions < 1:
        return None
    records, pos = length(pos + 4, 4)  # after the first partition's index
    if records < BATCH_HEADER.size:
        return None
    fields = BATCH_HEADER.unpack_from(frame, pos)
    return transactional_id, fields[9], fields[10]


def _transaction_of(request) -> tuple[str | None, tuple[int, int]]:
    """(transactional id, (producer id, epoch)) of a transaction's request (a Produce's: produce_producer)."""
    if hasattr(request, "v3_and_below_transactional_id"):  # AddPartitionsToTxn up to v3 (v4 on: brokers only)
        return request.v3_and_below_transactional_id, (request.v3_and_below_producer_id,
                                                      request.v3_and_below_producer_epoch)
    return getattr(request, "transactional_id", None), (getattr(request, "producer_id", -1),
                                                        getattr(request, "producer_epoch", -1))


def placeholder_request(frame: bytes) -> bytes:
    """An ApiVersions v0 request with the request's correlation id: the broker's answer to it holds the
    place of the refused request's answer among the connection's answers."""
    return struct.pack(">hhih", API_VERSIONS, 0, struct.unpack_from(">i", frame, 4)[0], -1)


def refusal_answer(request_schema, request, error: ErrorCode) -> bytes:
    """The body of the answer to a transaction's request that gives `error` for all of it."""
    module = sys.modules[request_schema.__module__.replace(".request", ".response")]
    schema = load_response_schema(request_schema.__api_key__, request_schema.__version__)
    no_wait = i32Timedelta.parse(datetime.timedelta(0))
    if hasattr(request, "topic_data"):  # Produce
        response = schema(responses=tuple(module.TopicProduceResponse(name=t.name, partition_responses=tuple(
            module.PartitionProduceResponse(index=p.index, error_code=error, base_offset=i64(-1), record_errors=())
            for p in t.partition_data)) for t in request.topic_data))
    elif hasattr(request, "v3_and_below_topics"):  # AddPartitionsToTxn
        response = schema(throttle_time=no_wait, results_by_topic_v3_and_below=tuple(
            module.AddPartitionsToTxnTopicResult(name=t.name, results_by_partition=tuple(
                module.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=error)
                for p in t.partitions)) for t in request.v3_and_below_topics))
    elif hasattr(request, "topics"):  # TxnOffsetCommit
        response = schema(throttle_time=no_wait, topics=tuple(module.TxnOffsetCommitResponseTopic(
            name=t.name, partitions=tuple(module.TxnOffsetCommitResponsePartition(
                partition_index=p.partition_index, error_code=error) for p in t.partitions)) for t in request.topics))
    else:  # AddOffsetsToTxn, EndTxn
        response = schema(throttle_time=no_wait, error_code=error)
    buffer = io.BytesIO()
    if schema.__flexible__:
        buffer.write(b"\0")  # the response header's tagged fields: none
    entity_writer(schema)(buffer, response)
    return buffer.getvalue()


class KafkaFront:
    def __init__(self, listen_host: str, listen_port: int, upstream_host: str, upstream_port: int,
                 transactions: Path | None = None):
        self.listen = (listen_host, listen_port)
        self.upstream = (upstream_host, upstream_port)
        self.transactions = Transactions(transactions)
        self.index = MarkerIndex(upstream_host, upstream_port)
        self.generation = 0  # of the logs: a topic made, deleted or cut since makes every kept backlog stale

    async def serve(self) -> None:
        server = await asyncio.start_server(self._client, *self.listen, limit=STREAM_LIMIT)
        LOG.info("listening on %s:%d, broker at %s:%d", *self.listen, *self.upstream)
        async with server:
            await server.serve_forever()

    async def _client(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker = await BrokerConnection.open(*self.upstream)
        except OSError:
            client_writer.close()
            return
        link = Link(client_writer, broker, FetchWait(self.upstream))
        requests = asyncio.create_task(self._requests(client_reader, link))
        responses = asyncio.create_task(self._responses(broker, link))
        done, rest = await asyncio.wait({requests, responses}, return_when=asyncio.FIRST_COMPLETED)
        if responses in done and not responses.cancelled() and responses.exception() is None:
            self.index.forget()  # the broker closed the connection: it may have restarted
        for task in rest:
            task.cancel()
        link.fetch_wait.close()
        for writer in (client_writer, broker):
            writer.close()

    async def _requests(self, reader, link: Link) -> None:
        try:
            while True:
                frame = await _read_frame(reader)
                api_key, version, correlation = _request_header(frame)
                if api_key == FETCH:
                    request = self._fetch_request(frame, version)
                    if not link.pending and (answer := await self._from_backlog(request, correlation, link)):
                        async with link.writing:  # nothing in flight: this answer is the next one due
                            await _write_frame(link.client, answer)
                        continue
                elif self.transactions.concerns(api_key, frame, version):
                    frame, request = self.transactions.request(frame, api_key, version)
                else:
                    request = PendingRequest(api_key, version)
                if api_key in LOG_CHANGES:
                    self.generation += 1
                    if api_key != DELETE_RECORDS:  # a name may now hold another log
                        self.index.forget(self._topics_named(frame, api_key, version))
                # Answers go back in order: a fetch's waits for them. (A Produce with acks=0 has no answer, and
                # a producer's connection never fetches; a transaction's Produce has acks=all.)
                if api_key != PRODUCE or request.answer is not None:
                    link.pending[correlation] = request
                await _write_frame(link.broker, frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def _fetch_request(self, frame: bytes, version: int) -> PendingRequest:
        schema = load_request_schema(FETCH, version)
        request, _ = entity_reader(schema)(frame, _request_body_offset(frame, schema.__flexible__))
        waits = request.min_bytes > 0 and getattr(request, "session_epoch", NO_FETCH_SESSION) == NO_FETCH_SESSION
        wait = dict(wait_s=request.max_wait.total_seconds(), frame=frame) if waits else {}
        partitions = [(t.topic, p) for t in request.topics for p in t.partitions]
        return PendingRequest(
            FETCH, version, {(t, p.partition): p.fetch_offset for t, p in partitions},
            read_committed=getattr(request, "isolation_level", 0) == READ_COMMITTED,
            limits={(t, p.partition): p.partition_max_bytes for t, p in partitions},
            max_bytes=getattr(request, "max_bytes", 2**31 - 1), **wait)

    async def _from_backlog(self, request: PendingRequest, correlation: int, link: Link) -> bytes | None:
        """The answer to a fetch from what the connection was answered beyond what it asked, if that holds
        records where the fetch asks and every other partition asked was at its end; else None (the broker
        answers: a partition at its end that finds nothing is held there, FetchWait)."""
        kept = [link.backlogs.get(key) for key in request.fetch_offsets]
        if not all(b is not None and b.current(request, self.generation) for b in kept):
            return None
        offsets = list(request.fetch_offsets.values())
        holding = [b.holds(offset) for b, offset in zip(kept, offsets, strict=True)]
        if not any(holding) or not all(h or b.at_end(o) for h, b, o in zip(holding, kept, offsets, strict=True)):
            return None
        topics: dict[str, list] = {}
        for backlog in kept:
            topics.setdefault(backlog.topic.topic, []).append(backlog)
        response = dataclasses.replace(kept[0].response, responses=tuple(
            dataclasses.replace(b[0].topic, partitions=tuple(x.answer for x in b)) for b in topics.values()))
        response = await self._fetch_answer(response, request, link, {key: b.end for key, b in zip(
            request.fetch_offsets, kept, strict=True)})
        schema = load_response_schema(FETCH, request.version)
        buffer = io.BytesIO()
        buffer.write(struct.pack(">i", correlation) + (b"\0" if schema.__flexible__ else b""))  # no tagged fields
        entity_writer(schema)(buffer, response)
        return buffer.getvalue()

    @staticmethod
    def _topics_named(frame: bytes, api_key: int, version: int) -> set[str] | None:
        schema = load_request_schema(api_key, version)
        try:
            request, _ = entity_reader(schema)(frame, _request_body_offset(frame, schema.__flexible__))
        except Exception:  # noqa: BLE001 - when in doubt, forget every topic
            return None
        names = getattr(request, "topic_names", None) or ()
        topics = getattr(request, "topics", ()) or ()
        return {*names, *(getattr(t, "name", None) for t in topics)} - {None}

    async def _responses(self, broker: BrokerConnection, link: Link) -> None:
        try:
            while True:
                frame = await broker.read_frame()
                (correlation,) = struct.unpack_from(">i", frame, 0)
                request = link.pending.get(correlation)
                if request is not None and request.answer is not None:  # refused: the broker's answer held its place
                    frame = b"".join((frame[:4], request.answer))
                elif request is not None and request.api_key in (FETCH, *ADDRESS_ANSWERS, API_VERSIONS):
                    frame = await self._answer(frame, request, link)
                elif request is not None and request.ends is not None:
                    self.transactions.answered(frame, request)
                async with link.writing:
                    await _write_frame(link.client, frame)
                link.pending.pop(correlation, None)  # once written: an answer from a backlog may follow
        except ConnectionError:
            return

    async def _answer(self, frame: bytes, request: PendingRequest, link: Link) -> bytes:
        """The response as Apache Kafka would give it: the front's address; Fetch's records in the measure
        asked, its aborted transactions as Kafka lists them."""
        schema = load_response_schema(request.api_key, request.version)
        flexible = schema.__flexible__ and request.api_key != API_VERSIONS  # its header is always v0
        start = _header_size(frame, flexible)

        def read(frame: bytes):
            try:
                return entity_reader(schema)(frame, start)[0]
            except Exception:  # noqa: BLE001 - an answer the schema does not fit (an error reply): as it is
                LOG.warning("could not read a response to api %d v%d: relayed as it is", request.api_key,
                            request.version, exc_info=True)
                return None

        response = read(frame)
        if response is not None and request.wait_s and _nothing_fetched(response):
            # Held like Kafka holds it; the connection's later answers wait behind it, as there.
            frame, response = await link.fetch_wait.answer(frame, response, request, read)
        if response is None:
            return frame
        if request.api_key == FETCH:
            changed = await self._fetch_answer(response, request, link)
        elif request.api_key == API_VERSIONS:
            changed = dataclasses.replace(response, api_keys=tuple(
                dataclasses.replace(k, max_version=i16(min(k.max_version, FETCH_MAX_VERSION)))
                if k.api_key == FETCH else k for k in response.api_keys))
        else:
            changed = as_front(response, *self.listen)
        if changed is response:
            return frame
        buffer = io.BytesIO()
        buffer.write(frame[:start])
        entity_writer(schema)(buffer, changed)
        return buffer.getvalue()

    async def _fetch_answer(self, response, request: PendingRequest, link: Link, ends: dict | None = None):
        """The answer cut to the fetch's measure, the rest kept (`ends`: where the records of a kept backlog
        end), with its aborted transactions as Kafka lists them."""
        ends = ends or {}
        topics, changed = [], False
        aborted_type = sys.modules[type(response).__module__].AbortedTransaction  # of the answer's version
        budget = request.max_bytes
        for topic in response.responses:
            partitions, rewritten = [], False
            for data in topic.partitions:
                key = (topic.topic, data.partition_index)
                offset = request.fetch_offsets.get(key)
                link.backlogs.pop(key, None)
                if offset is not None and not data.error_code.value:
                    # Kafka's measure: the partition's bytes, and the fetch's, of which the first batch
                    # of the answer is given whatever its size.
                    records, end = ((data.records, ends[key]) if key in ends else whole_batches(data.records or b""))
                    given, rest, given_end = cut_records(records, offset, min(request.limits[key], budget),
                                                         at_least_one=budget == request.max_bytes)
                    budget -= len(given)
                    # Kept without the answer's other partitions, whose backlogs keep theirs.
                    link.backlogs[key] = Backlog(
                        dataclasses.replace(response, responses=()), dataclasses.replace(topic, partitions=()),
                        dataclasses.replace(data, records=rest), given_end, max(end, given_end),
                        getattr(data, "last_stable_offset", data.high_watermark) if request.read_committed
                        else data.high_watermark,
                        request.version, request.read_committed, self.generation)
                    if len(given) != len(records):
                        data, rewritten = dataclasses.replace(data, records=given), True
                if request.read_committed:
                    kept = await self._overlapping(topic.topic, data, offset, aborted_type)
                    if kept is not data.aborted_transactions:
                        data, rewritten = dataclasses.replace(data, aborted_transactions=kept), True
                partitions.append(data)
            if rewritten:
                topic, changed = dataclasses.replace(topic, partitions=tuple(partitions)), True
            topics.append(topic)
        return dataclasses.replace(response, responses=tuple(topics)) if changed else response

    async def _overlapping(self, topic: str, data, fetch_offset: int | None, aborted_type):
        """The partition's aborted transactions as Apache Kafka would list them (kafka_listing), those the
        answer cannot place decided by the index of markers."""
        if fetch_offset is None:
            return data.aborted_transactions
        listed = sorted((t.producer_id, t.first_offset) for t in data.aborted_transactions or ())
        records = memoryview(data.records or b"")
        kept, undecided = kafka_listing(listed, records, fetch_offset)
        log_start = max(data.log_start_offset, 0)
        if undecided:
            markers = await self.index.markers(topic, data.partition_index, log_start, fetch_offset, undecided)
            kept += [(producer_id, first) for producer_id, first in undecided if not markers.ended_before(
                producer_id, first, fetch_offset, [f for p, f in listed if p == producer_id])]
        self.index.learn(topic, data.partition_index, log_start, fetch_offset, records)
        kept.sort()
        if kept == listed:
            return data.aborted_transactions
        LOG.debug("%s[%d] fetch at %d: aborted transactions %s listed as %s", topic, data.partition_index,
                  fetch_offset, listed, kept)
        return tuple(aborted_type(producer_id=i64(p), first_offset=i64(f)) for p, f in kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_batch_dev.kafka_front", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="where clients connect")
    parser.add_argument("--broker-port", type=int, required=True, help="the broker's own port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--transactions", type=Path,
                        help="the file of the broker's open transactions (the front starts with the broker)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    front = KafkaFront(args.host, args.port, args.host, args.broker_port, args.transactions)
    try:
        import uvloop

        uvloop.run(front.serve())
    except ImportError:
        asyncio.run(front.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
