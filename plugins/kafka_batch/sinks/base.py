"""The Sink interface: how a batch's results enter, leave and are previewed in Postgres.

The core owns positions, batches, attempts, the ledger and the one commit transaction; a sink only
says how its rows get there. On the Spark side `compute` turns a batch's parsed records into a
small result (or stages big ones from the executors); inside the commit transaction `apply` makes
it visible, `remove` takes given ranges' effect out exactly, and `preview` stores what a replay
would change. A sink never touches positions, batches or attempts.

Adding a sink: one module with a `Sink` subclass (its fields are its settings, typed), registered in
`kafka_batch.sinks.SINKS`; the definition's schema and reference follow from it.
"""

from __future__ import annotations

import collections
import io
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from psycopg2 import sql
from pydantic import AfterValidator, BeforeValidator, Field

from kafka_batch.errors import InputError, StateError
from kafka_batch.kafka.ranges import OffsetRange
from kafka_batch.model import Expression, Identifier, Model

if TYPE_CHECKING:  # pyarrow where a sink computes (see kafka_batch.sinks)
    import pyarrow as pa
    from pyspark.sql import DataFrame

# Spark SQL type for each Postgres column type a sink may declare.
COLUMN_TYPES = {
    "text": "string",
    "bigint": "bigint",
    "integer": "int",
    "double precision": "double",
    "boolean": "boolean",
    "date": "date",
    "timestamptz": "timestamp",
}
# The name information_schema gives a declared type, where it differs.
_CATALOG_NAMES = {"timestamptz": "timestamp with time zone"}


@dataclass(frozen=True)
class Column:
    """An output column: a Spark SQL expression over the record's fields and metadata, and its type."""

    name: str
    expr: str
    type: str

    @property
    def spark_type(self) -> str:
        return COLUMN_TYPES[self.type]

    @property
    def catalog_type(self) -> str:
        return _CATALOG_NAMES.get(self.type, self.type)


@dataclass(frozen=True)
class RangeCounts:
    records: int = 0     # processed by the sinks
    tombstones: int = 0  # null values: counted, never processed
    invalid: int = 0     # quarantined (see kafka_batch.spark.transform)


def collect_arrow(frame) -> pa.Table:
    """A sink's result at the driver, as Arrow, in one round trip. Spark Connect's toArrow first asks
    the server for the result's schema (an analysis of the whole plan, 0.05-0.1 s of every batch),
    though the answer to running the plan carries that schema too; classic pyspark collects once."""
    to_table = getattr(frame, "_to_table", None)  # Spark Connect's DataFrame (pyspark is pinned)
    if to_table is None:
        return frame.toArrow()
    table, schema = to_table()
    return table.cast(_as_to_arrow(schema or frame.schema))


def _as_to_arrow(schema) -> pa.Schema:
    """The Arrow schema a Spark Connect result is cast to: toArrow's, the declared types, times in UTC."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC")


def stream_arrow(frame) -> Iterator[pa.Table]:
    """A result at the driver in pieces, in the order of its Spark partitions, as they arrive: under Spark
    Connect the server sends each partition's Arrow batches in turn while it computes the next ones, so the
    driver holds one piece at a time. Classic pyspark hands its Arrow batches over in the order they finish
    (`collectAsArrowToPython`), so there the result comes whole, as `collect_arrow` gives it."""
    if getattr(frame, "_to_table", None) is None:  # classic pyspark
        yield collect_arrow(frame)
        return
    client = frame._session.client
    import pyarrow as pa

    target = None
    for piece in client.to_table_as_iterator(frame._plan.to_proto(client), frame._plan.observations):
        if not isinstance(piece, pa.Table):  # the schema comes first
            target = _as_to_arrow(piece)
            continue
        yield piece if target is None else piece.cast(target)


def stream_waves(frames: Iterable[DataFrame], ahead: int = 1, held: int = 1) -> Iterator[pa.Table]:
    """The results of several frames (a batch's waves), one after the other, each in pieces as
    `stream_arrow` gives them. Under Spark Connect the next `ahead` frames' queries run while this one's
    pieces are taken (a thread each starts its query and takes `held` pieces ahead; the server computes
    the rest meanwhile and keeps them), so the server never waits for the driver and holds a few waves'
    results, never the batch's."""
    frames = iter(frames)
    first, second = next(frames, None), next(frames, None)
    if second is None or getattr(first, "_to_table", None) is None:  # one wave; or classic pyspark, in turn
        for frame in itertools.chain((f for f in (first, second) if f is not None), frames):
            yield from stream_arrow(frame)
        return
    frames = itertools.chain([first, second], frames)
    running = collections.deque(_ReadAhead(frame, held) for frame in itertools.islice(frames, ahead + 1))
    try:
        while running:
            yield from running[0]
            running.popleft()
            running.extend(_ReadAhead(frame, held) for frame in itertools.islice(frames, 1))
    finally:
        for reader in running:
            reader.stop()


class _ReadAhead:
    """One frame's pieces, read by a thread into a bounded queue, under the caller's Spark tags (a batch's
    tag lets the fence watch interrupt it)."""

    _END = object()

    def __init__(self, frame, held: int):
        import queue
        import threading

        self._queue: queue.Queue = queue.Queue(held)
        self._stopped = threading.Event()
        tags = frame._session.getTags()
        self._thread = threading.Thread(target=self._read, args=(frame, tags), daemon=True, name="read ahead")
        self._thread.start()

    def _read(self, frame, tags) -> None:
        for tag in tags:
            frame._session.addTag(tag)
        try:
            for piece in stream_arrow(frame):
                self._put(piece)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, who raises it
            self._put(exc)
        self._put(self._END)

    def _put(self, item) -> None:
        import queue

        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[pa.Table]:
        while (item := self._queue.get()) is not self._END:
            if isinstance(item, BaseException):
                raise item
            yield item

    def stop(self) -> None:
        """No one takes its pieces any more: the thread stops at its next one (a failed batch's query is
        interrupted by its tag)."""
        self._stopped.set()


def range_counts(result: pa.Table) -> dict[int, RangeCounts]:
    """Per range: records, tombstones and invalid records, from rows that carry those counts and `range_id`."""
    totals = sums_by_range(result, ("records", "tombstones", "invalid"))
    return {row["range_id"]: RangeCounts(row["records"], row["tombstones"], row["invalid"]) for row in totals.to_pylist()}


def sums_by_range(table: pa.Table, counts: Sequence[str]) -> pa.Table:
    """The integer columns `counts` summed per `range_id` (a null as 0), one row per range in range order.
    In numpy rather than pyarrow's group_by, whose engine (acero) a driver would import for this alone:
    0.3 s of every batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = table["range_id"]
    ranges = pc.unique(ids).sort()
    which = pc.index_in(ids, value_set=ranges).to_numpy()
    # Float sums are exact up to 2**53: far above any count of records.
    sums = {column: np.bincount(which, table[column].cast(pa.int64()).fill_null(0).to_numpy(), len(ranges))
            for column in counts}
    return pa.table({"range_id": ranges.cast(pa.int64()), **{c: pa.array(v.astype(np.int64)) for c, v in sums.items()}})


@dataclass(frozen=True)
class SinkOutput:
    """What `compute` hands to the commit: per-range counts (None: the sink reads no records, as a
    changelog publishes what another sink changed), and the result `apply` takes."""

    counts: dict[int, RangeCounts] | None
    result: Any


@dataclass(frozen=True)
class StageContext:
    """The attempt a computation belongs to, and where executors may stage rows."""

    batch_id: int
    attempt: int
    postgres: dict = field(repr=False)
    tasks: Sequence[Sequence[OffsetRange]] = ()
    """The read's tasks, in the order of its Spark partitions (a streamed result arrives in it)."""
    publication: Any = None
    """A publishing sink's publication, opened before the read (kafka_batch.sinks.kafka.Publication)."""
    waves: Callable[[], Iterator[DataFrame]] | None = None
    """The records again, a task at a time in task order, for a result as big as the batch (see
    `stream_waves`); None: the records as `compute` gets them, whole."""
    cores: int = 1
    """How many of `waves` Spark runs at once."""


class ColumnSpec(Model):
    """An output column as a definition gives it: `name: {expr, type}`, or `name: expr` for the default type."""

    expr: Expression
    """A Spark SQL expression over the record's fields and metadata columns."""
    type: Literal[tuple(COLUMN_TYPES)] = "text"  # type: ignore[valid-type]
    """The Postgres column type."""


class MeasureSpec(ColumnSpec):
    """A measure of the aggregate sink: it must add up (sums), so its type is a number."""

    type: Literal["bigint", "double precision"] = "bigint"
    """The Postgres column type (a sum: bigint or double precision)."""


def _expression_shorthand(value: Any) -> Any:
    return {"expr": value} if isinstance(value, str) else value


def spec_or_expression(spec: type[ColumnSpec]) -> Any:
    """A column spec given as `{expr, type}`, or as its expression alone (the spec's default type)."""
    return Annotated[spec, BeforeValidator(_expression_shorthand, json_schema_input_type=Expression | spec)]


def _named(specs: dict[str, ColumnSpec]) -> tuple[Column, ...]:
    return tuple(Column(name, spec.expr, spec.type) for name, spec in specs.items())


def at(field_name: str, columns_: Sequence[Column]) -> tuple[tuple[str, Column], ...]:
    """Each column with its path under the definition's field (`measures.views`)."""
    return tuple((f"{field_name}.{c.name}", c) for c in columns_)


def columns(spec: type[ColumnSpec]) -> Any:
    """A non-empty mapping `column name -> spec` in the definition; the sink gets a tuple of Columns."""
    return Annotated[dict[Identifier, spec_or_expression(spec)], Field(min_length=1), AfterValidator(_named)]


def names(columns: Sequence[str], side: str | None = None) -> sql.Composable:
    """`a, b` or, with a side (a table alias), `side.a, side.b`."""
    if side is None:
        return sql.SQL(", ").join(map(sql.Identifier, columns))
    return sql.SQL(", ").join(sql.Identifier(side, c) for c in columns)


def same(columns: Sequence[str], left: str, right: str) -> sql.Composable:
    """`left.a = right.a AND ...`"""
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(left, c), sql.Identifier(right, c))
                                 for c in columns)


def as_json(side: str, columns: Sequence[str]) -> sql.Composable:
    """jsonb_build_object('a', side.a, ...): a preview's key or values."""
    return sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, {}").format(sql.Literal(c), sql.Identifier(side, c)) for c in columns
    ))


def copy_arrow(cur, table: sql.Composable, data: pa.Table | pa.RecordBatch) -> None:
    """COPY Arrow rows into a table (columns by name) in Postgres's binary format, encoded from the
    columns as they are (pgpq): three times faster than CSV, and nulls, '' and floats stay exact.
    Each Arrow type must be the column's (int64 for bigint, int32 for integer, ...), as Spark's are.
    The rows are encoded a slice at a time as psycopg2 sends them, so the server inserts one slice
    while the next is encoded (all encoded first: 0.1 s more for 1M rows)."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(table, names(data.schema.names))
    cur.copy_expert(statement.as_string(cur), _BinaryCopy(data), COPY_READ_BYTES)


COPY_READ_BYTES = 65536  # what psycopg2 reads from _BinaryCopy per message to the server
COPY_SLICE_ROWS = 16384  # the rows encoded at a time


class _BinaryCopy(io.RawIOBase):
    """Postgres's binary COPY of Arrow rows as a file psycopg2 reads: the header, each slice's rows
    encoded when the bytes before them are read, the trailer."""

    def __init__(self, data: pa.Table | pa.RecordBatch):
        import pyarrow as pa
        from pgpq import ArrowToPostgresBinaryEncoder
        self._encoder = ArrowToPostgresBinaryEncoder(data.schema)
        rows = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        self._slices = iter(rows.to_batches(max_chunksize=COPY_SLICE_ROWS))
        self._pending = memoryview(self._encoder.write_header())
        self._finished = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while not self._pending and not self._finished:
            rows = next(self._slices, None)
            if rows is None:
                self._pending, self._finished = memoryview(self._encoder.finish()), True
            else:
                self._pending = memoryview(self._encoder.write_batch(rows))
        size = len(self._pending) if size is None or size < 0 else size
        chunk, self._pending = bytes(self._pending[:size]), self._pending[size:]
        return chunk


def require_columns(cur, pipeline_name: str, schema: str, table: str, expected: list[tuple[str, str]]) -> bool:
    """Refuse a table that exists with other columns than the definition gives, saying how to migrate.

    Returns whether the table exists (so DDL, which waits behind running commits, runs only when needed).
    """
    cur.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    )
    existing = cur.fetchall()
    if existing and existing != expected:
        raise InputError(
            f"pipeline {pipeline_name!r}: table {schema}.{table} exists with columns {existing}, but the definition "
            f"gives {expected}. Migrate it first (ALTER TABLE to the new columns, or rename it and let the pipeline "
            "create a new one, then replay the committed ranges into it), or point the sink at a new table"
        )
    return bool(existing)


def create_per_range_table(cur, schema: str, name: str, defs: sql.Composable, keys: Sequence[str] = ()) -> None:
    """A table of per-range state (`range_id` first in `defs`), COPYed into by commits. No per-row
    constraint: a commit checks its rows once, as a set (`check_new_ranges`). Range ids only grow, so
    rows lie in range-id order and a BRIN index finds a range's rows for almost no cost at insert.
    Given `keys`, a btree on them finds a key's rows in every range, for a sink that asks that on every
    commit (it costs about as much as the COPY itself)."""
    table = sql.Identifier(schema, name)
    cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table, defs))
    cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING brin (range_id) WITH (autosummarize = on)")
                .format(sql.Identifier(f"{name}_range"[:63]), table))
    if keys:
        cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(f"{name}_keys"[:63]), table, names(keys)))


def check_new_ranges(cur, table: sql.Composable, range_ids: Sequence[int], what: str) -> None:
    """What a foreign key and a key would check row by row, once for a commit's rows: their ranges exist
    and have no rows in the per-range table yet."""
    cur.execute(
        sql.SQL(
            "SELECT array(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM kafka_batch.batch_ranges"
            " WHERE id = ANY(%(ids)s)), EXISTS (SELECT 1 FROM {} WHERE range_id = ANY(%(ids)s))"
        ).format(table),
        {"ids": list(range_ids)},
    )
    unknown, present = cur.fetchone()
    if unknown or present:
        raise StateError(f"{what}: ranges {sorted(unknown) or sorted(range_ids)} are unknown or already have rows"
                         f" in {table.as_string(cur)}; nothing was committed")


def ranges_table(ranges: Sequence[OffsetRange]) -> tuple[str, tuple]:
    """A FROM item of the given ranges (id, topic, partition, from, until) as bound arrays."""
    return (
        "(SELECT unnest(%s::bigint[]) AS range_id, unnest(%s::text[]) AS topic, unnest(%s::int[]) AS partition,"
        " unnest(%s::bigint[]) AS from_offset, unnest(%s::bigint[]) AS until_offset)",
        ([r.range_id for r in ranges], [r.topic for r in ranges], [r.partition for r in ranges],
         [r.from_offset for r in ranges], [r.until_offset for r in ranges]),
    )


class Sink(Model, ABC):
    """One kind of output of a pipeline. Instances are immutable parts of a pipeline definition: the
    sink's fields are its section of the definition (`sinks: {<kind>: ...}`), validated by their types."""

    kind: ClassVar[str]
    publishes: ClassVar[bool] = False
    """Its output leaves Postgres (a Kafka topic): `publish` runs last in the commit transaction."""

    @property
    def required_columns(self) -> tuple[Column, ...]:
        """Columns that must not be null for this sink: a record where one is null is invalid."""
        return ()

    @property
    def columns_used(self) -> tuple[Column, ...] | None:
        """Every column whose expression `compute` evaluates: the reader builds only the record columns
        they name. None (the default) makes the reader build every record column."""
        return None

    def expressions(self) -> tuple[tuple[str, Column], ...]:
        """Every expression of the sink with its path in the sink's section (`measures.views`), each as the
        column `compute` casts it to: Spark's analyzer resolves them before a batch is planned."""
        return ()

    @property
    def tables(self) -> tuple[str, ...]:
        """The public tables this sink writes (two pipelines may not share one)."""
        return ()

    @property
    def publishes_tables(self) -> tuple[str, ...]:
        """Tables of the pipeline's other sinks whose changes this sink publishes (keyed ones)."""
        return ()

    def problem_with(self, pipeline) -> str | None:
        """What in the rest of the pipeline's definition this sink cannot work with (the definition is
        refused with it), or None."""
        return None

    def invalid_when(self) -> list[tuple[Any, Any]]:
        """(condition, reason) Spark columns over a parsed record that make it invalid: quarantined, so no
        sink processes it (the sinks of a pipeline process the same records)."""
        return []

    @property
    def uses_registry(self) -> bool:
        """It writes through the Schema Registry (Avro values)."""
        return False

    @property
    def reads_records(self) -> bool:
        """`compute` reads the batch's records (a sink publishing another's changes reads none)."""
        return not self.publishes_tables

    @abstractmethod
    def create(self, cur, pipeline_name: str) -> None:
        """Create the sink's tables; refuse existing ones whose columns differ from the definition."""

    @abstractmethod
    def compute(self, records: DataFrame, stage: StageContext) -> SinkOutput:
        """Spark side: the batch's parsed records -> counts and a result for `apply` (driver-sized).

        Records carry `_tombstone` and `_invalid` (a reason, or null); only records with neither
        enter the output, and every one is counted per range."""

    @abstractmethod
    def apply(self, cur, result: Any) -> int:
        """Inside the commit transaction: make the batch's result visible; returns the output table's rows it
        inserted, updated or deleted (the ledger keeps them per table, for lineage)."""

    @abstractmethod
    def remove(self, cur, ranges: Sequence[OffsetRange]) -> int:
        """Inside a transaction: take exactly these committed ranges' effect out; returns the output
        table's rows it updated or deleted."""

    @abstractmethod
    def preview(self, cur, batch_id: int, replaced: Sequence[OffsetRange], result: Any) -> int:
        """Store in kafka_batch.replay_previews how replacing `replaced` by `result` would change the
        output (per key: before and after); change nothing else. Returns how many keys would change."""

    def open(self, batch, attempt: int, kafka_config: dict, pending: dict[int, str],
             registry_config: dict | None = None) -> Any:
        """Before the read, for a sink that `publishes` what Spark computes: the attempt's publication, which
        `compute` sends to as results arrive (StageContext.publication) and `publish` completes; None if it
        publishes in the commit only (the arguments as `publish`'s)."""
        return None

    def publish(self, cur, result: Any, batch, attempt: int, kafka_config: dict, pending: dict[int, str],
                registry_config: dict | None = None) -> int:
        """Last in the commit transaction, for a sink that `publishes`: send the batch's output, or complete
        what `open` began, exactly once across attempts (`pending`: the pipeline's other batches that may
        still commit, which kafka_publish.decide needs; `registry_config`: for a sink that `uses_registry`);
        returns the messages it sent."""
        raise NotImplementedError(f"the {self.kind} sink does not publish")

    def discard(self, cur, batch_id: int, attempt: int | None) -> None:  # noqa: B027 - optional hook
        """Drop what an attempt of the batch (None: every attempt) staged; most sinks stage nothing."""

    def fold(self, cur, range_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Inside a transaction: the ranges left the replay horizon; merge any per-range state they keep
        into a base without changing the output (they will never be removed one by one again)."""


class TableSink(Sink, ABC):
    """A sink whose output is a Postgres table, changed inside the commit transaction."""

    table: Identifier
    """The table in the public schema that holds the output (created when missing)."""
    keyed: ClassVar[bool] = False
    """The table has a primary key, so its changes can be published as a changelog."""

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.table,)
