"""Pipeline definitions: a pipeline is data (a YAML file), so a new one needs no new code.

A pipeline names its topics, how to parse a record, its sinks (where results go: aggregates,
rows, ...), its limits and its policies. Everything is validated when loaded, so a typo fails with a
message naming the file and the field, not halfway through a batch. A batch keeps the canonical
JSON of the definition it was planned with (`snapshot`), so every attempt computes the same thing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from kafka_batch.errors import InputError
from kafka_batch.sinks import SINKS, Sink
from kafka_batch.sinks.base import fail as _fail
from kafka_batch.sinks.base import identifier as _identifier

PROJECT_ROOT = Path(__file__).resolve().parents[2]

FIELD_TYPES = {"string", "long", "int", "double", "boolean", "timestamp"}
# Columns every record has besides its parsed fields; expressions may use them.
RECORD_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key")


def pipelines_dir() -> Path:
    return Path(os.environ.get("KAFKA_BATCH_PIPELINES_DIR", PROJECT_ROOT / "pipelines"))


def user_cache_dir() -> Path:
    """Where what speeds up spark-submit on this machine is kept (nothing in it is needed to be correct)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kafka_batch"


@dataclass(frozen=True)
class Limits:
    max_records_per_partition: int = 1_000_000
    max_records_per_batch: int = 10_000_000
    max_records_per_task: int = 1_000_000
    min_tasks: int = 1
    # Above this share of invalid records a batch fails instead of quarantining: a schema change
    # upstream should stop the pipeline, not quarantine everything.
    max_invalid_ratio: float = 0.1
    max_value_bytes: int = 1_048_576  # a larger record value is invalid


@dataclass(frozen=True)
class ReadSettings:
    consume_batch_size: int = 10_000
    poll_timeout_seconds: float = 1.0
    stall_timeout_seconds: float = 120.0
    fence_check_seconds: float = 5.0  # how often a running job checks that its attempt is still current
    kafka_timeout_seconds: float = 30.0  # how long planning waits for Kafka's metadata and offsets answers


@dataclass(frozen=True)
class Replayable:
    """The replay horizon: how long committed ranges stay replayable (and rewindable) range by range.

    A range older than every bound given is folded: sinks merge the per-range state they keep (the
    aggregate's contributions) into a base, in a commit transaction, without changing the output; the
    state then grows with the horizon, not with every batch. No bound: ranges stay replayable forever.
    """

    batches: int | None = None  # the ranges of the newest N committed batches (replays included)
    days: float | None = None  # ranges committed within the last D days

    @property
    def bounded(self) -> bool:
        return self.batches is not None or self.days is not None

    def __str__(self) -> str:
        bounds = [f"the newest {self.batches} committed batches"] if self.batches is not None else []
        bounds += [f"the last {self.days:g} days"] if self.days is not None else []
        return " or ".join(bounds) or "forever"


@dataclass(frozen=True)
class Connections:
    kafka: str = "kafka_default"
    postgres: str = "kafka_batch_postgres"
    spark: str = "spark_default"


@dataclass(frozen=True)
class StartPolicy:
    """Where a new pipeline begins: `earliest`, `latest`, explicit `offsets`, or a `timestamp`."""

    kind: str = "earliest"
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Pipeline:
    name: str
    topics: tuple[str, ...]
    fields: dict[str, str]
    sinks: tuple[Sink, ...]
    topic_pattern: str | None = None
    start: StartPolicy = field(default_factory=StartPolicy)
    new_partitions: str = "earliest"
    plan_by: str = "offsets"  # or "time": a run reads up to the end of its data interval
    schedule: str | None = None
    on_data_loss: str = "fail"
    on_invalid_record: str = "quarantine"  # or "fail": a record the pipeline cannot process stops the batch
    limits: Limits = field(default_factory=Limits)
    read: ReadSettings = field(default_factory=ReadSettings)
    replayable: Replayable = field(default_factory=Replayable)
    connections: Connections = field(default_factory=Connections)
    source: str = field(default="<memory>", compare=False)
    # The validated definition as canonical JSON data: what a batch snapshots and hashes.
    definition: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def dag_id(self) -> str:
        return f"kafka_batch__{self.name}"

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

    def with_limits(self, **overrides: int | None) -> Pipeline:
        """The pipeline with some limits changed for one run (a triggered run's params)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        return parse_pipeline({**self.definition, "limits": {**self.definition.get("limits", {}), **given}},
                              source=self.source)


def _positive_numbers(where: str, section: str, raw: Any, cls: type) -> Any:
    raw = raw or {}
    if not isinstance(raw, dict):
        raise _fail(where, f"{section} must be a mapping")
    known = cls.__dataclass_fields__
    unknown = set(raw) - set(known)
    if unknown:
        raise _fail(where, f"unknown {section} setting(s) {sorted(unknown)}; known: {sorted(known)}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _fail(where, f"{section}.{key} must be a positive number, got {value!r}")
        if key.endswith("_ratio") and value > 1:
            raise _fail(where, f"{section}.{key} is a share of records, between 0 and 1, got {value!r}")
    return cls(**raw)


def _topics(where: str, raw: Any) -> tuple[tuple[str, ...], str | None]:
    """A list of names, one name, or {pattern: regex} (matched in full against the topic names)."""
    if isinstance(raw, dict):
        if set(raw) != {"pattern"} or not isinstance(raw["pattern"], str) or not raw["pattern"]:
            raise _fail(where, "topics as a mapping must be {pattern: <regular expression>}")
        try:
            re.compile(raw["pattern"])
        except re.error as exc:
            raise _fail(where, f"topics.pattern {raw['pattern']!r} is not a valid regular expression: {exc}") from exc
        return (), raw["pattern"]
    if isinstance(raw, str):
        raw = [raw]
    if not raw or not isinstance(raw, list) or not all(isinstance(t, str) and t for t in raw):
        raise _fail(where, "topics must be a non-empty list of topic names or {pattern: <regular expression>}")
    if len(set(raw)) != len(raw):
        raise _fail(where, f"topics {raw} name a topic twice")
    return tuple(raw), None


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


def _start(where: str, raw: Any) -> StartPolicy:
    if raw in ("earliest", "latest"):
        return StartPolicy(raw)
    if isinstance(raw, dict) and set(raw) == {"timestamp"}:
        return StartPolicy("timestamp", timestamp_ms=parse_time_ms(raw["timestamp"], f"pipeline {where}: start.timestamp"))
    if isinstance(raw, dict) and set(raw) == {"offsets"} and isinstance(raw["offsets"], dict) and raw["offsets"]:
        offsets = {}
        for topic, per_partition in raw["offsets"].items():
            if not isinstance(per_partition, dict) or not per_partition:
                raise _fail(where, f"start.offsets.{topic} must map partition -> offset")
            for partition, offset in per_partition.items():
                if isinstance(partition, bool) or isinstance(offset, bool):
                    raise _fail(where, f"start.offsets.{topic}: partition {partition!r} -> offset {offset!r}")
                try:
                    partition, offset = int(partition), int(offset)
                except (TypeError, ValueError):
                    raise _fail(where, f"start.offsets.{topic}: {partition!r}: {offset!r} must be integers") from None
                if partition < 0 or offset < 0:
                    raise _fail(where, f"start.offsets.{topic}: partition {partition} and offset {offset} must be >= 0")
                offsets[(topic, partition)] = offset
        return StartPolicy("offsets", offsets=offsets)
    raise _fail(
        where,
        f"start {raw!r} must be 'earliest', 'latest', {{timestamp: <ISO 8601>}} or "
        "{offsets: {<topic>: {<partition>: <offset>}}}",
    )


def parse_pipeline(raw: Any, source: str = "<memory>") -> Pipeline:
    """Validate one pipeline definition (already parsed from YAML, or a batch's snapshot)."""
    if not isinstance(raw, dict):
        raise _fail(source, "definition must be a mapping")
    raw = json.loads(json.dumps(raw, default=str))  # canonical data: YAML dates become ISO strings
    name = raw.get("name")
    where = f"{name!r} ({source})" if name else source
    name = _identifier(where, "name", name)
    known = {
        "name", "topics", "start", "new_partitions", "plan_by", "schedule", "on_data_loss", "on_invalid_record", "limits",
        "read", "connections", "replayable",
        "record", "sinks", "description",
    }
    if "aggregation" in raw:
        raise _fail(where, "'aggregation' moved under 'sinks': write `sinks: {aggregate: {table, group_by, measures}}`")
    unknown = set(raw) - known
    if unknown:
        raise _fail(where, f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}")

    topics, topic_pattern = _topics(where, raw.get("topics"))
    start = _start(where, raw.get("start", "earliest"))
    unknown_topics = {t for t, _ in start.offsets} - set(topics)
    if unknown_topics and topic_pattern is None:
        raise _fail(where, f"start.offsets names topic(s) {sorted(unknown_topics)} that are not in topics")
    new_partitions = raw.get("new_partitions", "earliest")
    if new_partitions not in ("earliest", "latest"):
        raise _fail(where, f"new_partitions {new_partitions!r} must be 'earliest' or 'latest'")
    on_data_loss = raw.get("on_data_loss", "fail")
    if on_data_loss not in ("fail", "skip"):
        raise _fail(where, f"on_data_loss {on_data_loss!r} must be 'fail' or 'skip'")
    on_invalid_record = raw.get("on_invalid_record", "quarantine")
    if on_invalid_record not in ("quarantine", "fail"):
        raise _fail(where, f"on_invalid_record {on_invalid_record!r} must be 'quarantine' or 'fail'")

    record = raw.get("record") or {}
    if record.get("format", "json") != "json":
        raise _fail(where, f"record.format {record.get('format')!r} is not supported (only 'json')")
    fields = record.get("fields")
    if not isinstance(fields, dict) or not fields:
        raise _fail(where, "record.fields must map each JSON field to a type")
    for fname, ftype in fields.items():
        if not isinstance(fname, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", fname):
            raise _fail(where, f"record.fields name {fname!r} is not a plain field name")
        if fname in RECORD_COLUMNS:
            raise _fail(where, f"record.fields name {fname!r} clashes with the record column of that name")
        if ftype not in FIELD_TYPES:
            raise _fail(where, f"record.fields.{fname} type {ftype!r} is not one of {sorted(FIELD_TYPES)}")

    sinks = _sinks(where, raw.get("sinks"))
    used = [n for sink in sinks for n in sink.tables]
    if len(set(used)) != len(used):
        raise _fail(where, f"two sinks write the same table ({sorted(used)})")

    connections = raw.get("connections") or {}
    unknown = set(connections) - set(Connections.__dataclass_fields__)
    if unknown:
        raise _fail(where, f"unknown connection(s) {sorted(unknown)}; known: kafka, postgres, spark")

    schedule = raw.get("schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise _fail(where, f"schedule must be a cron expression, a preset like '@hourly', or null, got {schedule!r}")

    plan_by = raw.get("plan_by", "offsets")
    if plan_by not in ("offsets", "time"):
        raise _fail(where, f"plan_by {plan_by!r} must be 'offsets' or 'time'")
    if plan_by == "time" and (schedule is None or schedule.startswith("@")):
        raise _fail(where, "plan_by: time needs a cron schedule (its runs' data intervals bound the batches)")

    return Pipeline(
        name=name,
        topics=topics,
        topic_pattern=topic_pattern,
        fields=dict(fields),
        sinks=sinks,
        start=start,
        new_partitions=new_partitions,
        plan_by=plan_by,
        schedule=schedule,
        on_data_loss=on_data_loss,
        on_invalid_record=on_invalid_record,
        limits=_positive_numbers(where, "limits", raw.get("limits"), Limits),
        read=_positive_numbers(where, "read", raw.get("read"), ReadSettings),
        replayable=_replayable(where, raw.get("replayable")),
        connections=Connections(**connections),
        source=source,
        definition=raw,
    )


def _replayable(where: str, raw: Any) -> Replayable:
    replayable = _positive_numbers(where, "replayable", raw, Replayable)
    if replayable.batches is not None and not isinstance(replayable.batches, int):
        raise _fail(where, f"replayable.batches must be a whole number, got {replayable.batches!r}")
    return replayable


def _sinks(where: str, raw: Any) -> tuple[Sink, ...]:
    if not isinstance(raw, dict) or not raw:
        raise _fail(where, f"sinks must map one or more of {sorted(SINKS)} to their settings")
    unknown = set(raw) - set(SINKS)
    if unknown:
        raise _fail(where, f"unknown sink(s) {sorted(unknown)}; known: {sorted(SINKS)}")
    return tuple(SINKS[kind].parse(where, raw[kind]) for kind in sorted(raw))


def from_snapshot(definition: dict, source: str) -> Pipeline:
    """The pipeline a batch was planned with (its stored definition), whatever the YAML says now."""
    return parse_pipeline(definition, source=source)


def load_pipeline_file(path: Path) -> Pipeline:
    try:
        raw = yaml.safe_load(path.read_text())
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
        except InputError as exc:
            if invalid is None:
                raise
            invalid[str(path)] = str(exc)
            continue
        tables.update(dict.fromkeys(pipeline.tables, pipeline.name))
        pipelines[pipeline.name] = pipeline
    return pipelines


def load_pipeline(name: str, directory: Path | None = None) -> Pipeline:
    """One pipeline by name; another pipeline's broken file does not stop it."""
    invalid: dict[str, str] = {}
    pipelines = load_pipelines(directory, invalid)
    if name not in pipelines:
        where = directory or pipelines_dir()
        broken = "".join(f"; invalid file {path}: {error}" for path, error in invalid.items())
        raise InputError(f"unknown pipeline {name!r}; defined in {where}: {sorted(pipelines) or 'none'}{broken}")
    return pipelines[name]
