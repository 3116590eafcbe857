"""Pipeline definitions: a pipeline is data (a YAML file), so a new one needs no new code.

A pipeline names its topics, how to parse a record, its sinks (where results go: aggregates, rows,
...), its limits and its policies. `Pipeline` is one typed model of that file (pydantic; each sink's
settings are the sink's own fields): it validates a definition when loaded, so a typo fails with one
line naming the file and the field, not halfway through a batch, and `schema()` gives the JSON Schema
editors check `pipelines/*.yaml` with. A batch keeps the canonical JSON of the definition it was
planned with (`snapshot`), so every attempt computes the same thing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Strict,
    Tag,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kafka_batch.errors import InputError
from kafka_batch.model import DescribedSchema, Identifier, Model, PositiveInt, PositiveNumber, TopicName, invalid
from kafka_batch.sinks import SINKS, Sink
from kafka_batch.sinks.base import Column

if TYPE_CHECKING:
    from kafka_batch.formats import avro, protobuf

PROJECT_ROOT = Path(__file__).resolve().parents[2]

FIELD_TYPES = ("string", "long", "int", "double", "boolean", "timestamp")
# Columns every record has besides its parsed fields; expressions may use them.
RECORD_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key")
# The columns an envelope adds besides the fields it wraps (kafka_batch.spark.envelope).
ENVELOPE_COLUMNS = {"debezium": ("op", "ts_ms", "source")}
# Columns a binary (Avro, Protobuf) record adds: the whole decoded record and key, and the raw value kept
# for the quarantine.
BINARY_COLUMNS = ("record", "record_key", "value", "range_id")


def pipelines_dir() -> Path:
    """Where pipeline files are read: KAFKA_BATCH_PIPELINES_DIR; else the checkout's pipelines/ when the
    package runs from a checkout; else, installed, `$AIRFLOW_HOME/pipelines` (beside Airflow's dags/)."""
    if os.environ.get("KAFKA_BATCH_PIPELINES_DIR"):
        return Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"])
    if (PROJECT_ROOT / "pyproject.toml").is_file():
        return PROJECT_ROOT / "pipelines"
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow") / "pipelines"


def log_dir() -> Path:
    """Where the command line writes Spark's logs: KAFKA_BATCH_LOG_DIR (the local home's `logs/` under
    `kafka-batch local up`), else the temporary directory's `kafka-batch-logs`."""
    import tempfile

    return Path(os.environ.get("KAFKA_BATCH_LOG_DIR") or Path(tempfile.gettempdir()) / "kafka-batch-logs")


def user_cache_dir() -> Path:
    """This machine's caches (the JVM class archive, the Spark home view): nothing in it is needed to be correct."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kafka_batch"


def parse_time_ms(value: Any, what: str) -> int:
    """An ISO 8601 date-time with a time zone (or a datetime from YAML) as epoch milliseconds."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"{what} {value!r} is not an ISO 8601 date-time") from None
    else:
        raise InputError(f"{what} must be an ISO 8601 date-time with a time zone, got {value!r}")
    if moment.tzinfo is None:
        raise InputError(f"{what} {value!r} needs a time zone (e.g. 2026-01-01T00:00:00Z)")
    return int(moment.timestamp() * 1000)


def optional_time_ms(value: Any, what: str) -> int | None:
    """Like parse_time_ms, for an optional argument: None stays None."""
    return None if value is None else parse_time_ms(value, what)


class Limits(Model):
    """How much one batch, partition and task may read."""

    max_records_per_partition: PositiveInt = 1_000_000
    """Offsets one batch reads from a partition at most."""
    max_records_per_batch: PositiveInt = 10_000_000
    """Offsets one batch reads at most, shared fairly between partitions."""
    max_records_per_task: PositiveInt = 1_000_000
    """Offsets one Spark task reads at most (a range is split above it)."""
    min_tasks: PositiveInt = 1
    """Split ranges so that a batch has at least this many read tasks."""
    max_invalid_ratio: Annotated[float, Strict(), Field(gt=0, le=1)] = 0.1
    """Above this share of invalid records a batch fails instead of quarantining: a schema change
    upstream should stop the pipeline, not quarantine everything."""
    max_value_bytes: PositiveInt = 1_048_576
    """A record value larger than this is invalid (quarantined)."""


class ReadSettings(Model):
    """How the read tasks and the planner talk to Kafka."""

    consume_batch_size: PositiveInt = 10_000
    """Records one consume call asks for."""
    poll_timeout_seconds: PositiveNumber = 1.0
    """How long one consume call waits."""
    stall_timeout_seconds: PositiveNumber = 120.0
    """A read task that gets no record for this long fails (the range is not there to read)."""
    fence_check_seconds: PositiveNumber = 5.0
    """How often a running job checks that its attempt is still the batch's current one."""
    kafka_timeout_seconds: PositiveNumber = 30.0
    """How long planning waits for Kafka's metadata and offsets answers."""


class Timeouts(Model):
    """How long each task of a run may take before Airflow ends it (the task's `execution_timeout`), so
    that a run never waits forever, whatever Kafka, Postgres or Spark do; a task ended so is retried, and
    what its attempt left is what a killed attempt leaves (the next one fences it). Unset: derived from
    the limits and read settings."""

    plan_seconds: PositiveInt | None = None
    """The plan task. Default: ten `read.kafka_timeout_seconds` and a minute (6 minutes)."""
    execute_seconds: PositiveInt | None = None
    """One attempt of a batch: Spark's read and compute and the commit, publishes included. Default: 10
    minutes, and `limits.max_records_per_batch` at 10,000 records a second (about 27 minutes for 10M)."""
    report_seconds: PositiveInt | None = None
    """The report task. Default: as the plan task's."""


SLOWEST_RATE = 10_000  # records a second a batch is assumed to reach at least, for its default time bound


class Replayable(Model):
    """The replay horizon: how long committed ranges stay replayable (and rewindable) range by range.

    A range older than every bound given is folded: sinks merge the per-range state they keep (the
    aggregate's contributions) into a base, in a commit transaction, without changing the output; the
    state then grows with the horizon, not with every batch. No bound: ranges stay replayable forever.
    """

    batches: PositiveInt | None = None
    """The ranges of the newest N committed batches (replays included) stay replayable."""
    days: PositiveNumber | None = None
    """Ranges committed within the last D days stay replayable."""

    @property
    def bounded(self) -> bool:
        return self.batches is not None or self.days is not None

    def __str__(self) -> str:
        bounds = [f"the newest {self.batches} committed batches"] if self.batches is not None else []
        bounds += [f"the last {self.days:g} days"] if self.days is not None else []
        return " or ".join(bounds) or "forever"


class Alerts(Model):
    """How far behind the pipeline may fall: over a bound, `kafka-batch status --check` exits non-zero
    with one line (for a cron or a probe) and the console page flags the pipeline."""

    max_lag_records: PositiveInt | None = None
    """Records between the positions and the last stable offsets, summed over the pipeline's partitions."""
    max_lag_seconds: PositiveNumber | None = None
    """The age of the oldest record not read yet."""

    def breaches(self, lag: int, oldest_unread_at: datetime | None, now: datetime) -> list[str]:
        """What is over its bound, one phrase each (empty: within the bounds)."""
        found = []
        if self.max_lag_records is not None and lag > self.max_lag_records:
            found.append(f"lag {lag} records over max_lag_records {self.max_lag_records}")
        age = None if oldest_unread_at is None or not lag else (now - oldest_unread_at).total_seconds()
        if self.max_lag_seconds is not None and age is not None and age > self.max_lag_seconds:
            found.append(f"oldest unread record {age:.0f} s old, over max_lag_seconds {self.max_lag_seconds:g}")
        return found


class Connections(Model):
    """The Airflow connection ids (locally: `AIRFLOW_CONN_*` variables) of the pipeline's endpoints."""

    kafka: str = "kafka_default"
    """Kafka: librdkafka settings in the connection's extra."""
    kafka_output: str | None = None
    """The Kafka cluster the pipeline's Kafka sink publishes to, when it is not `kafka`'s (its producer, the
    sink's transactional id and publish group live there)."""
    postgres: str = "kafka_batch_postgres"
    """Postgres: positions, the ledger and the sink tables."""
    spark: str = "spark_default"
    """Spark: a `spark` connection (spark-submit) or a `spark_connect` one (a Spark Connect server)."""
    schema_registry: str = "schema_registry_default"
    """A Schema Registry (records in the Confluent wire format): its URL as the host (or `url` in the extra),
    basic auth as login and password, a bearer token or TLS files as the client's settings in the extra."""

    @property
    def publish(self) -> str:
        """The connection the Kafka sink publishes on."""
        return self.kafka_output or self.kafka


def _plain_field_name(name: str) -> str:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise PydanticCustomError("field_name", "{name!r} is not a plain field name", {"name!r": repr(name)})
    if name in RECORD_COLUMNS:
        raise PydanticCustomError("field_name", "{name!r} clashes with the record column of that name",
                                  {"name!r": repr(name)})
    return name


def _formats():
    """The binary formats' modules (avro, protobuf), imported where a definition uses one: fastavro's and
    protobuf's imports would cost every command of a JSON pipeline."""
    from kafka_batch.formats import avro, protobuf

    return avro, protobuf


class BinaryView(Model):
    """A reader view of a binary format: what a record's key (or value) is read as."""

    format: Literal["avro", "protobuf"] = "avro"
    """The encoding: `avro` or `protobuf`."""
    framing: Literal["confluent", "none"] = "confluent"
    """`confluent`, the Confluent wire format Kafka's serializers write (magic byte 0, the 4-byte id of
    the writer schema in the Schema Registry of `connections.schema_registry`, for Protobuf the message
    indexes, then the binary); `none`, the plain binary alone (no registry)."""
    view_schema: dict | str | None = Field(None, alias="schema")
    """The reader view. Avro: a schema (a mapping, or its JSON text); Protobuf: the text of a .proto
    file (with `message`). Every record is read as this whatever schema wrote it (Avro's resolution
    rules: added fields take their defaults, removed ones vanish; Protobuf's: unknown fields are
    skipped, missing ones read as their defaults)."""
    message: str | None = None
    """For `protobuf`: the full name of the message records are (default: the first message of `schema`)."""

    # A value's Avro view must be a record (its fields are the pipeline's); a key's may be any type.
    _records_only: ClassVar[bool] = False

    def _view_members(self) -> dict:
        """Check the view; its top-level fields (name -> type)."""
        if self.view_schema is None:
            raise ValueError(f"format {self.format} needs `schema` (what records are read as)")
        if self.message is not None and self.format != "protobuf":
            raise ValueError("`message` is for format protobuf")
        avro, protobuf = _formats()
        try:
            return dict(self.view.type.members)
        except (avro.SchemaProblem, protobuf.ProtoProblem) as exc:
            raise ValueError(f"schema: not a usable {self.format} schema: {exc}") from None

    @model_validator(mode="after")
    def _usable(self) -> BinaryView:
        if self.format != "json":
            self._view_members()
        return self

    @cached_property
    def view(self) -> avro.ReaderView | protobuf.ProtoView:
        """The reader view, parsed (Avro) or compiled (Protobuf)."""
        avro, protobuf = _formats()
        if self.format == "avro":
            return avro.ReaderView(avro.load_schema(self.view_schema, self._records_only))
        if not isinstance(self.view_schema, str):
            raise protobuf.ProtoProblem("give the text of a .proto file")
        return protobuf.ProtoView(self.descriptor_set, self.message or protobuf.first_message(self.descriptor_set))

    @cached_property
    def descriptor_set(self) -> bytes:
        """The Protobuf view compiled (a serialized FileDescriptorSet): what executors get."""
        _, protobuf = _formats()
        return protobuf.compile_proto(self.view_schema, user_cache_dir() / "proto")

    def column(self, registry: dict | None, side: str) -> avro.AvroColumn | protobuf.ProtobufColumn:
        """The reader's decoder of this side of a record (`registry`: the client's settings)."""
        framed = registry if self.framing == "confluent" else None
        avro, protobuf = _formats()
        if self.format == "avro":
            return avro.AvroColumn(self.view.schema, framed, side)
        return protobuf.ProtobufColumn(self.descriptor_set, self.view.message, framed, side)


class RecordKey(BinaryView):
    """How a record's key is decoded: into the column `record_key` (a struct for a record or message, so
    `record_key.id` reaches a field), next to the raw `key`. A key that cannot be decoded makes the
    record invalid."""


class Record(BinaryView):
    """How a record's value becomes fields."""

    format: Literal["json", "avro", "protobuf"] = "json"  # type: ignore[assignment]
    """The value's encoding: `json` (with `fields`), `avro` or `protobuf` (with `schema`)."""
    _records_only: ClassVar[bool] = True

    key: RecordKey | None = None
    """Decode the record's key too (Avro or Protobuf), into the column `record_key`."""
    envelope: Literal[tuple(ENVELOPE_COLUMNS)] | None = None  # type: ignore[valid-type]
    """A wrapper around the fields. `debezium`: a change event; the fields come from `after` (from
    `before` for a delete), with or without the JSON converter's {schema, payload} wrapper, and `op`,
    `ts_ms` and `source` (`source.lsn`, `source.ts_ms`, ...) become columns expressions can use."""
    fields: Annotated[dict[Annotated[str, AfterValidator(_plain_field_name)], Literal[FIELD_TYPES]],  # type: ignore[valid-type]
                      Field(min_length=1)] | None = None
    """For `json`: each field of the value the pipeline uses, with its type; expressions name them as they are."""

    @model_validator(mode="after")
    def _consistent(self) -> Record:
        if self.format == "json":
            if self.fields is None:
                raise ValueError("format json needs `fields` (each field the pipeline uses, with its type)")
            given = ([k for k in ("framing", "key", "message") if k in self.model_fields_set]
                     + (["schema"] if self.view_schema is not None else []))
            if given:
                raise ValueError(f"{given} are for the binary formats (avro, protobuf)")
            return self._not_clashing()
        if self.fields is not None:
            raise ValueError(f"format {self.format} takes its fields from `schema`: leave `fields` out")
        members = dict(self.view.type.members)  # a usable view: BinaryView checked it
        if self.envelope == "debezium":
            after = members.get("after")
            if after is None or not after.members or "op" not in members or "before" not in members:
                raise ValueError("a debezium envelope's schema needs `before` and `after` records and `op`")
        return self._not_clashing()

    def _not_clashing(self) -> Record:
        clash = sorted(set(self.field_types) & set(ENVELOPE_COLUMNS.get(self.envelope, ())))
        if clash:
            raise ValueError(f"field name(s) {clash} clash with the {self.envelope} envelope's columns")
        return self

    @property
    def uses_registry(self) -> bool:
        return ((self.format != "json" and self.framing == "confluent")
                or (self.key is not None and self.key.framing == "confluent"))

    @cached_property
    def field_types(self) -> dict[str, str]:
        """The fields that become columns, with their Spark types. A field of a binary format named as a
        record column (or `record`, `value`) is not one: `record.<name>` reaches it."""
        if self.format == "json":
            return dict(self.fields)
        members = self.view.type.members
        if self.envelope == "debezium":
            members = dict(members)["after"].members
        hidden = {*RECORD_COLUMNS, *BINARY_COLUMNS}
        return {name: t.spark for name, t in members if name not in hidden}


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _distinct(topics: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(topics)) != len(topics):
        raise PydanticCustomError("topics", "{topics} name a topic twice", {"topics": list(topics)})
    return topics


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PydanticCustomError("regex", "{pattern!r} is not a valid regular expression: {why}",
                                  {"pattern!r": repr(pattern), "why": str(exc)}) from None
    return pattern


TopicNames = Annotated[tuple[TopicName, ...],
                       BeforeValidator(_one_or_many, json_schema_input_type=TopicName | Annotated[
                           list[TopicName], Field(min_length=1)]),
                       Field(min_length=1), AfterValidator(_distinct)]


class TopicPattern(Model):
    """Every topic whose whole name matches; new matching topics join as they appear."""

    pattern: Annotated[str, Strict(), Field(min_length=1), AfterValidator(_regex)]
    """A regular expression, matched against the whole topic name."""


def _iso_time(value: Any) -> str:
    try:
        parse_time_ms(value, "a start time")
    except InputError as exc:
        raise PydanticCustomError("time", "{why}", {"why": str(exc).removeprefix("a start time ")}) from None
    return value


class StartAtTime(Model):
    """Begin each partition at the first record at or after a time."""

    timestamp: Annotated[str, BeforeValidator(_iso_time)]
    """An ISO 8601 date-time with a time zone, e.g. 2026-01-01T00:00:00Z."""


class StartAtOffsets(Model):
    """Begin at given offsets (partitions not named begin where `new_partitions` says)."""

    offsets: Annotated[dict[str, Annotated[dict[Annotated[int, Field(ge=0)], Annotated[int, Strict(), Field(ge=0)]],
                                           Field(min_length=1)]], Field(min_length=1)]
    """topic -> partition -> offset."""


# A union's branch is chosen by the input's shape, so a mistake is explained by that branch alone. Tags
# are written `<...>`: they are not fields, and error paths leave them out (model._path).
Start = Annotated[
    Annotated[Literal["earliest", "latest"], Tag("<name>")]
    | Annotated[StartAtTime, Tag("<timestamp>")]
    | Annotated[StartAtOffsets, Tag("<offsets>")],
    Discriminator(lambda v: "<name>" if v in ("earliest", "latest") else None if not isinstance(v, dict) else
                  "<timestamp>" if "timestamp" in v else "<offsets>" if "offsets" in v else None,
                  custom_error_type="start",
                  custom_error_message="must be 'earliest', 'latest', {timestamp: <ISO 8601>} or "
                                       "{offsets: {<topic>: {<partition>: <offset>}}}"),
]
Topics = Annotated[
    Annotated[TopicNames, Tag("<names>")] | Annotated[TopicPattern, Tag("<pattern>")],
    Discriminator(lambda v: "<pattern>" if isinstance(v, dict) else "<names>"),
]


@dataclass(frozen=True)
class StartPolicy:
    """Where a new pipeline begins: `earliest`, `latest`, explicit `offsets`, or a `timestamp`."""

    kind: str = "earliest"
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp_ms: int | None = None


Sinks = create_model(
    "Sinks", __base__=Model, __doc__="Where results go: one or more sinks, each with its settings.",
    **{kind: (sink | None, Field(default=None, description=(sink.__doc__ or "").strip())) for kind, sink in SINKS.items()},
)


class Pipeline(Model):
    """A pipeline definition: one file of `pipelines/`."""

    name: Identifier
    """The pipeline's name (its DAG is `kafka_batch__<name>`)."""
    description: str | None = None
    """What the pipeline is for (shown as the DAG's description)."""
    topic_selection: Topics = Field(alias="topics")
    """A topic, a list of topics, or {pattern: <regular expression>}."""
    start_at: Start = Field("earliest", alias="start")
    """Where a partition without a stored position begins."""
    new_partitions: Literal["earliest", "latest"] = "earliest"
    """Where a partition that appears after the pipeline started begins."""
    plan_by: Literal["offsets", "time"] = "offsets"
    """`offsets`: a run reads up to the last stable offsets; `time`: up to the end of its data interval."""
    schedule: str | None = None
    """A cron expression or preset (`@hourly`); null: runs only when triggered."""
    pool: str | None = None
    """The Airflow pool whose slot the execute task takes (null: Airflow's `default_pool`). Pipelines that
    share a Spark Connect server or a Postgres can name one pool of N slots (`airflow pools set NAME N
    ...`): at most N of their batches then execute at once, the others queue in Airflow. Airflow leaves a
    task of a pool it does not have scheduled, never run; the console names such a pipeline's pool."""
    on_data_loss: Literal["fail", "skip"] = "fail"
    """A stored position below the log start (retention deleted unread records), or a log truncated below it (an unclean leader election): stop, or record the loss and go on."""
    on_invalid_record: Literal["quarantine", "fail"] = "quarantine"
    """A record the pipeline cannot process: quarantine it with its reason, or stop the batch."""
    record: Record
    """How a record's value becomes the fields that sinks' expressions use."""
    sink_settings: Sinks = Field(alias="sinks")  # type: ignore[valid-type]
    """Where results go; a pipeline may have several sinks."""
    limits: Limits = Limits()
    """How much one batch, partition and task may read (a triggered run may lower them for itself)."""
    read: ReadSettings = ReadSettings()
    """How the read tasks and the planner talk to Kafka."""
    replayable: Replayable = Replayable()
    """How long committed ranges stay replayable and rewindable range by range (default: forever)."""
    timeouts: Timeouts = Timeouts()
    """How long each task of a run may take before Airflow ends it and retries (default: from the limits)."""
    alerts: Alerts = Alerts()
    """How far behind the pipeline may fall before `kafka-batch status --check` fails (default: no bound)."""
    connections: Connections = Connections()
    """The Airflow connection ids of the pipeline's endpoints."""

    _source: str = PrivateAttr("<memory>")
    # The definition as given, canonical JSON data: what a batch snapshots and hashes.
    _definition: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "aggregation" in data:
            raise PydanticCustomError(
                "moved", "'aggregation' moved under 'sinks': write `sinks: {aggregate: {table, group_by, measures}}`")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Pipeline:
        if not self.sinks:
            raise ValueError(f"sinks must name one or more of {sorted(SINKS)}")
        used = [n for sink in self.sinks for n in sink.tables]
        if len(set(used)) != len(used):
            raise ValueError(f"two sinks write the same table ({sorted(used)})")
        problems = [problem for sink in self.sinks if (problem := sink.problem_with(self)) is not None]
        if self.connections.kafka_output and not self.publishing_sinks:
            problems.append("connections.kafka_output names the cluster a Kafka sink publishes to, and the pipeline"
                            " has no Kafka sink")
        if problems:
            raise ValueError("; ".join(problems))
        unknown_topics = {t for t, _ in self.start.offsets} - set(self.topics)
        if unknown_topics and self.topic_pattern is None:
            raise ValueError(f"start.offsets names topic(s) {sorted(unknown_topics)} that are not in topics")
        if self.plan_by == "time" and (self.schedule is None or self.schedule.startswith("@")):
            raise ValueError("plan_by: time needs a cron schedule (its runs' data intervals bound the batches)")
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pipeline) and other.snapshot() == self.snapshot()

    def __hash__(self) -> int:
        return hash(self.snapshot())

    @property
    def source(self) -> str:
        return self._source

    @property
    def definition(self) -> dict:
        return self._definition

    @property
    def topics(self) -> tuple[str, ...]:
        return () if isinstance(self.topic_selection, TopicPattern) else self.topic_selection

    @property
    def topic_pattern(self) -> str | None:
        return self.topic_selection.pattern if isinstance(self.topic_selection, TopicPattern) else None

    @property
    def start(self) -> StartPolicy:
        if isinstance(self.start_at, StartAtTime):
            return StartPolicy("timestamp", timestamp_ms=parse_time_ms(self.start_at.timestamp, "start.timestamp"))
        if isinstance(self.start_at, StartAtOffsets):
            return StartPolicy("offsets", offsets={(t, p): o for t, per in self.start_at.offsets.items()
                                                   for p, o in per.items()})
        return StartPolicy(self.start_at)

    @property
    def fields(self) -> dict[str, str]:
        """The record's fields that are columns, with their Spark types."""
        return self.record.field_types

    @property
    def sinks(self) -> tuple[Sink, ...]:
        return tuple(s for kind in sorted(SINKS) if (s := getattr(self.sink_settings, kind)) is not None)

    def expressions(self) -> list[tuple[str, Column]]:
        """Every expression of the definition, with its path (`sinks.aggregate.measures.views`)."""
        return [(f"sinks.{sink.kind}.{path}", column) for sink in self.sinks for path, column in sink.expressions()]

    @property
    def uses_registry(self) -> bool:
        """Its records are read, or a sink's values written, through the Schema Registry."""
        return self.record.uses_registry or any(sink.uses_registry for sink in self.sinks)

    @property
    def publishing_sinks(self) -> tuple[Sink, ...]:
        """The sinks whose output leaves Postgres (to Kafka): they publish last in the commit."""
        return tuple(s for s in self.sinks if s.publishes)

    @property
    def dag_id(self) -> str:
        return f"kafka_batch__{self.name}"

    @property
    def replay_dag_id(self) -> str:
        return f"{self.dag_id}__replay"

    @property
    def topics_label(self) -> str:
        return ", ".join(self.topics) if self.topics else f"topics matching /{self.topic_pattern}/"

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(t for sink in self.sinks for t in sink.tables)

    def snapshot(self) -> str:
        """The definition as compact JSON, in its own key order (column order is meaningful)."""
        return json.dumps(self.definition, separators=(",", ":"))

    @property
    def definition_hash(self) -> str:
        return hashlib.sha256(self.snapshot().encode()).hexdigest()

    def task_timeouts(self) -> dict[str, int]:
        """Seconds each task of a run may take (`timeouts`, or what the limits and read settings give)."""
        asking = 10 * self.read.kafka_timeout_seconds + 60
        given = self.timeouts
        return {
            "plan": given.plan_seconds or int(asking),
            "execute": given.execute_seconds or int(600 + self.limits.max_records_per_batch / SLOWEST_RATE),
            "report": given.report_seconds or int(asking),
        }

    def with_limits(self, **overrides: int | None) -> Pipeline:
        """The pipeline with some limits changed for one run (a triggered run's params)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        return parse_pipeline({**self.definition, "limits": {**self.definition.get("limits", {}), **given}},
                              source=self.source)


def schema() -> dict:
    """The JSON Schema of a pipeline file (`kafka-batch schema`; editors complete and check with it)."""
    described = Pipeline.model_json_schema(by_alias=True, schema_generator=DescribedSchema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **described}


def parse_pipeline(raw: Any, source: str = "<memory>") -> Pipeline:
    """Validate one pipeline definition (already parsed from YAML, or a batch's snapshot)."""
    if not isinstance(raw, dict):
        raise InputError(f"pipeline {source}: definition must be a mapping")
    raw = json.loads(json.dumps(raw, default=str))  # canonical data: YAML dates become ISO strings
    name = raw.get("name")
    where = f"{name!r} ({source})" if isinstance(name, str) and name else source
    try:
        pipeline = Pipeline.model_validate(raw)
    except ValidationError as exc:
        raise invalid(where, exc) from None
    pipeline._source, pipeline._definition = source, raw
    return pipeline


def from_snapshot(definition: dict, source: str) -> Pipeline:
    """The pipeline a batch was planned with (its stored definition), whatever the YAML says now."""
    return parse_pipeline(definition, source=source)


# libyaml's safe loader (PyYAML's wheels have it): 0.25 ms a pipeline file against the pure-Python one's
# 1.7 ms, paid for every file of the directory by every command and every parse of the DAG file.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_pipeline_file(path: Path) -> Pipeline:
    try:
        raw = yaml.load(path.read_text(), Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        raise InputError(f"pipeline file {path}: not valid YAML: {exc}") from exc
    return parse_pipeline(raw, source=str(path))


def load_pipelines(directory: Path | None = None, invalid: dict[str, str] | None = None) -> dict[str, Pipeline]:
    """All pipelines of a directory; names and target tables must be unique.

    With `invalid` (a dict), a file that fails costs only its own pipeline: its error is put there
    under the file's path and the other pipelines load; without it, the first error is raised.
    """
    directory = directory or pipelines_dir()
    pipelines: dict[str, Pipeline] = {}
    tables: dict[str, str] = {}
    for path in sorted(directory.glob("*.y*ml")):
        try:
            pipeline = load_pipeline_file(path)
            if pipeline.name in pipelines:
                raise InputError(f"pipeline {pipeline.name!r} is defined twice: {pipelines[pipeline.name].source} and {path}")
            clash = [t for t in pipeline.tables if t in tables]
            if clash:
                raise InputError(f"pipelines {tables[clash[0]]!r} and {pipeline.name!r} both write table {clash[0]!r}")
        except FileNotFoundError:  # removed since the listing (an editor's save, a deploy): it defines nothing now
            continue
        except InputError as exc:
            if invalid is None:
                raise
            invalid[str(path)] = str(exc)
            continue
        tables.update(dict.fromkeys(pipeline.tables, pipeline.name))
        pipelines[pipeline.name] = pipeline
    return pipelines


def invalid_dag_id(path: str) -> str:
    """The DAG that stands in for an invalid pipeline file (and says why)."""
    return "kafka_batch__invalid__" + re.sub(r"[^A-Za-z0-9_]", "_", Path(path).stem)


def load_pipeline(name: str, directory: Path | None = None) -> Pipeline:
    """One pipeline by name; another pipeline's broken file does not stop it."""
    invalid: dict[str, str] = {}
    pipelines = load_pipelines(directory, invalid)
    if name not in pipelines:
        own = [error for path, error in invalid.items() if Path(path).stem == name or f"pipeline {name!r} (" in error]
        if own:  # its own file is broken: that is the one line to say
            raise InputError(own[0])
        where = directory or pipelines_dir()
        broken = "".join(f"; invalid file {path}: {error}" for path, error in invalid.items())
        raise InputError(f"unknown pipeline {name!r}; defined in {where}: {sorted(pipelines) or 'none'}{broken}")
    return pipelines[name]
