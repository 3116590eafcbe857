"""What monitoring sees of the pipelines: one catalog of metric names (METRICS), the points of a batch
and of a pipeline's lag, and where they are sent.

Airflow tasks send through Airflow's own `Stats` (StatsD or OpenTelemetry, as Airflow's `[metrics]`
settings choose); the CLI through a StatsD client set up from the same `AIRFLOW__METRICS__*` variables
(`from_environment`: importing Airflow would cost every command 1.5 s), so one configuration serves both.
Names sit under `kafka_batch.` (after Airflow's own prefix); tags name the pipeline and, where they
apply, the topic and partition, the batch's kind, the phase or the error. Plain StatsD has no tags:
Airflow's `statsd_influxdb_enabled` puts them on the line (`name,pipeline=p:1|c`), which the Prometheus
StatsD exporter reads as labels; OpenTelemetry makes them attributes.

Sending never fails a batch nor waits for anyone (StatsD is UDP): a backend that cannot be reached is
said once in the log, and the batch goes on.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from kafka_batch.errors import StateError

log = logging.getLogger("kafka_batch.observability.metrics")

PREFIX = "kafka_batch"
GAUGE, COUNTER, TIMER = "gauge", "counter", "timer"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    tags: tuple[str, ...]
    description: str

    @property
    def stat(self) -> str:
        return f"{PREFIX}.{self.name}"


_TOPIC, _BATCH = ("pipeline", "topic"), ("pipeline", "kind")
_PARTITION = (*_TOPIC, "partition")
METRICS = {m.name: m for m in (
    Metric("topic.lag.records", GAUGE, _TOPIC, "per topic: records between the positions and the last stable offsets"),
    Metric("topic.lag.seconds", GAUGE, _TOPIC, "per topic: age of its oldest unread record (0: nothing unread)"),
    Metric("topic.partitions_behind", GAUGE, _TOPIC, "per topic: partitions with a lag"),
    Metric("lag.records", GAUGE, _PARTITION, "records between the position and the last stable offset"),
    Metric("lag.seconds", GAUGE, _PARTITION, "age of the oldest unread record (0: nothing unread)"),
    Metric("batch.committed", COUNTER, _BATCH, "batches committed (kind: batch or replay)"),
    Metric("batch.failed", COUNTER, (*_BATCH, "error"), "attempts that failed, by error (input, state, service, ...)"),
    Metric("batch.fenced", COUNTER, _BATCH, "attempts that lost a race: fenced by a newer attempt, or their "
                                            "compare-and-set found the position moved"),
    Metric("batch.retries", COUNTER, _BATCH, "attempts a committed batch needed beyond its first"),
    Metric("batch.records_read", COUNTER, _BATCH, "records a committed batch read (valid, tombstones, invalid)"),
    Metric("batch.records_committed", COUNTER, _BATCH, "records whose effect a committed batch committed"),
    Metric("batch.records_quarantined", COUNTER, _BATCH, "invalid records a committed batch quarantined"),
    Metric("batch.records_per_second", GAUGE, _BATCH, "records read per second of the batch's read and compute"),
    Metric("batch.messages_published", COUNTER, (*_BATCH, "topic"),
           "messages a committed batch's attempt published to a Kafka sink's topic (0 when an earlier attempt's"
           " Kafka transaction had published them and only its Postgres side was left)"),
    Metric("batch.duration", TIMER, (*_BATCH, "phase"),
           "a batch's phases in ms: plan, read (Spark reads and computes in one pass), commit (its Postgres"
           " statements), publish (its Kafka sinks' transactions, inside the commit), execute (the attempt from its"
           " start to its commit, Spark's start included)"),
    Metric("data_loss.offsets", COUNTER, _PARTITION, "offsets deleted by retention before they were read"),
    Metric("resets", COUNTER, (*_PARTITION, "direction"), "positions moved by hand (direction: rewind or skip)"),
)}


@dataclass(frozen=True)
class Point:
    name: str
    value: float
    tags: Mapping[str, str]

    @property
    def metric(self) -> Metric:
        return METRICS[self.name]


class Stats(Protocol):
    """What Airflow's `Stats` offers, and the CLI's StatsD client too."""

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict | None = None) -> None: ...

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *,
              tags: dict | None = None) -> None: ...

    def timing(self, stat: str, dt: float, *, tags: dict | None = None) -> None: ...


def _point(name: str, value: float, **tags) -> Point:
    metric = METRICS[name]
    assert set(tags) == set(metric.tags), f"{name} is tagged {metric.tags}, not {sorted(tags)}"
    return Point(name, value, {k: str(v) for k, v in tags.items()})


def batch_points(facts: Mapping) -> list[Point]:
    """The points of a committed batch, from its row in the ledger (`core.report.batch_facts`)."""
    tags = {"pipeline": facts["pipeline"], "kind": facts["kind"]}
    valid, tombstones, invalid = (facts[k] or 0 for k in ("records_read", "records_tombstone", "records_invalid"))
    read = valid + tombstones + invalid
    points = [
        _point("batch.committed", 1, **tags),
        _point("batch.retries", max(0, (facts["attempt"] or 1) - 1), **tags),
        _point("batch.records_read", read, **tags),
        _point("batch.records_committed", valid + tombstones, **tags),
        _point("batch.records_quarantined", invalid, **tags),
    ]
    published = facts["published"]
    points += [_point("batch.messages_published", sent["messages"], **tags, topic=topic)
               for topic, sent in published.items()]
    phases = {"read": facts["read_seconds"], "commit": facts["commit_seconds"], "execute": facts["execute_seconds"],
              "publish": sum(sent["seconds"] for sent in published.values()) if published else None}
    points += [_point("batch.duration", seconds * 1000, **tags, phase=phase)
               for phase, seconds in phases.items() if seconds is not None]
    if facts["read_seconds"]:
        points.append(_point("batch.records_per_second", read / facts["read_seconds"], **tags))
    points += [_point("data_loss.offsets", lost, pipeline=facts["pipeline"], topic=topic, partition=partition)
               for (topic, partition), lost in facts["offsets_lost"].items()]
    return points


def failure_points(pipeline: str, kind: str, error: Exception) -> list[Point]:
    """An attempt that failed: its error's kind, and whether it lost a race (a StateError: fenced by a
    newer attempt, or the position had moved)."""
    name = type(error).__name__.removesuffix("Error").lower() or "error"
    points = [_point("batch.failed", 1, pipeline=pipeline, kind=kind, error=name)]
    if isinstance(error, StateError):
        points.append(_point("batch.fenced", 1, pipeline=pipeline, kind=kind))
    return points


def plan_points(pipeline: str, kind: str, seconds: float) -> list[Point]:
    return [_point("batch.duration", seconds * 1000, pipeline=pipeline, kind=kind, phase="plan")]


def lag_points(pipeline: str, partitions: Iterable[Mapping], now: datetime) -> list[Point]:
    """Per topic (its lag, its oldest unread record's age, its partitions behind: what a dashboard of a
    topic of a thousand partitions shows first), then per partition the lag and the oldest unread
    record's age (`inspection.partitions`)."""
    points, topics = [], {}
    for p in partitions:
        where = {"pipeline": pipeline, "topic": p["topic"], "partition": p["partition"]}
        oldest = p.get("oldest_unread_at")
        age = 0.0 if not p["lag"] or oldest is None else max(0.0, (now - oldest).total_seconds())
        points += [_point("lag.records", p["lag"], **where), _point("lag.seconds", age, **where)]
        lag, seconds, behind = topics.get(p["topic"], (0, 0.0, 0))
        topics[p["topic"]] = (lag + p["lag"], max(seconds, age), behind + (1 if p["lag"] else 0))
    return [_point(name, value, pipeline=pipeline, topic=topic) for topic, values in topics.items()
            for name, value in zip(("topic.lag.records", "topic.lag.seconds", "topic.partitions_behind"), values,
                                   strict=True)] + points


def reset_points(pipeline: str, resets: Iterable) -> list[Point]:
    """The positions a rewind or skip moved (`core.resets.Reset`), by how many offsets."""
    return [_point("resets", abs(r.position - r.target), pipeline=pipeline, topic=r.topic, partition=r.partition,
                   direction=r.direction) for r in resets if r.direction != "none"]


def observe_batch(stats: Stats | None, conn, kafka, kafka_config: dict, pipeline, batch_id: int | None,
                  extra: Iterable[Point] = ()) -> None:
    """After a batch (None: a plan without one): its points when it committed, and the pipeline's lag
    now, with the oldest unread record's age (one small fetch per lagging partition). Nothing is asked
    of Postgres or Kafka when metrics are off."""
    if stats is None:
        return
    from kafka_batch.core import inspection, report

    points = list(extra)
    try:
        if batch_id is not None:
            facts = report.batch_facts(conn, batch_id)
            if facts["status"] == "committed":
                points += batch_points(facts)
        points += lag_points(pipeline.name, inspection.partitions(conn, kafka, kafka_config, pipeline),
                             datetime.now(UTC))
    except Exception as exc:  # noqa: BLE001 - monitoring must never fail a batch
        _say_once(f"metrics: could not read what batch {batch_id} of {pipeline.name} did ({exc})")
    send(stats, points)


_warned: set[str] = set()


def send(stats: Stats | None, points: Iterable[Point]) -> None:
    """Best effort: a point that cannot be sent is dropped, said once per process and reason."""
    if stats is None:
        return
    for point in points:
        metric = point.metric
        try:
            if metric.kind == COUNTER:
                stats.incr(metric.stat, int(point.value), tags=dict(point.tags))
            elif metric.kind == GAUGE:
                stats.gauge(metric.stat, point.value, tags=dict(point.tags))
            else:
                stats.timing(metric.stat, point.value, tags=dict(point.tags))
        except Exception as exc:  # noqa: BLE001 - monitoring must never fail a batch
            reason = f"{type(exc).__name__}: {exc}"
            _say_once(f"metrics: could not send {metric.stat} ({reason}); going on without it", key=reason)


def _on(name: str) -> bool:
    return os.environ.get(f"AIRFLOW__METRICS__{name}", "").strip().lower() in ("true", "1", "t", "yes", "on")


class StatsdStats:
    """A StatsD client that writes what Airflow's would: Airflow's prefix, then ours; with
    `statsd_influxdb_enabled`, the tags on the line."""

    def __init__(self, host: str, port: int, prefix: str, influxdb_tags: bool):
        from statsd import StatsClient

        self._client = StatsClient(host, port, prefix=prefix or None)
        self._tagged = influxdb_tags

    def _name(self, stat: str, tags: dict | None) -> str:
        if not self._tagged or not tags:
            return stat
        return stat + "".join(f",{k}={v}" for k, v in tags.items() if not set(f"{k}{v}") & {",", "=", " "})

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict | None = None) -> None:
        self._client.incr(self._name(stat, tags), count, rate)

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: dict | None = None) -> None:
        self._client.gauge(self._name(stat, tags), value, rate, delta)

    def timing(self, stat: str, dt: float, *, tags: dict | None = None) -> None:
        self._client.timing(self._name(stat, tags), dt)


# Seconds a command's one OTLP export may take. Under a second, the exporter gives up on a refused
# connection at once (its first retry waits a second); a collector that does not answer costs this much.
EXPORT_TIMEOUT = 0.5


class OtelStats:
    """An OpenTelemetry meter that records what Airflow's would (Airflow's prefix, then ours; tags as
    attributes; timings as exponential histograms in ms) and exports it over OTLP once, as the command
    exits: a command is short, so one export, bounded by the exporter's timeout (EXPORT_TIMEOUT unless
    the OTel variables say otherwise), and never retried past it."""

    def __init__(self, exporter, prefix: str, endpoint: str):
        from opentelemetry.sdk.metrics import Histogram, MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource

        service = os.environ.get("OTEL_SERVICE_NAME") or os.environ.get("AIRFLOW__METRICS__OTEL_SERVICE") or "airflow"
        self._exporter, self._prefix, self._endpoint = exporter, prefix, endpoint
        self._reader = InMemoryMetricReader()
        self._provider = MeterProvider(
            resource=Resource.create({SERVICE_NAME: service}), metric_readers=[self._reader], shutdown_on_exit=False,
            views=[View(instrument_type=Histogram, aggregation=ExponentialBucketHistogramAggregation())])
        self._meter = self._provider.get_meter("kafka_batch")
        self._instruments: dict[str, object] = {}
        atexit.register(self.export)

    def _instrument(self, stat: str, create: str, **kwargs):
        name = f"{self._prefix}.{stat}" if self._prefix else stat
        if name not in self._instruments:
            self._instruments[name] = getattr(self._meter, create)(name=name, **kwargs)
        return self._instruments[name]

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict | None = None) -> None:
        self._instrument(stat, "create_counter").add(count, attributes=tags)

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: dict | None = None) -> None:
        self._instrument(stat, "create_gauge").set(value, attributes=tags)

    def timing(self, stat: str, dt: float, *, tags: dict | None = None) -> None:
        self._instrument(stat, "create_histogram", unit="ms").record(dt, attributes=tags)

    def export(self) -> None:
        """Send what the command recorded, once; a backend that cannot take it is said in one line."""
        from opentelemetry.sdk.metrics.export import MetricExportResult

        data = self._reader.get_metrics_data()
        try:
            if data is not None and data.resource_metrics:
                if self._exporter.export(data) is not MetricExportResult.SUCCESS:
                    _say_once(f"metrics: OpenTelemetry at {self._endpoint} did not take this command's metrics;"
                              " going on without them")
        finally:
            self._exporter.shutdown()
            self._provider.shutdown()


def _otlp_exporter() -> tuple[object, str] | None:
    """Airflow's choice of exporter: the standard OTEL_EXPORTER_OTLP_* variables when they name an
    endpoint (gRPC or HTTP), else Airflow's deprecated otel_host and otel_port (HTTP)."""
    env = os.environ.get
    endpoint = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env("OTEL_EXPORTER_OTLP_ENDPOINT")
    protocol = env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env("OTEL_EXPORTER_OTLP_PROTOCOL")
    timeout = None if env("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT") or env("OTEL_EXPORTER_OTLP_TIMEOUT") else EXPORT_TIMEOUT
    if endpoint and protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    # Its own line about a failed export would repeat ours (OtelStats.export says it once, with the endpoint).
    logging.getLogger(OTLPMetricExporter.__module__).setLevel(logging.CRITICAL)
    if endpoint:
        return OTLPMetricExporter(timeout=timeout), endpoint
    host, port = env("AIRFLOW__METRICS__OTEL_HOST"), env("AIRFLOW__METRICS__OTEL_PORT")
    if not host or not port:
        _say_once("metrics: OpenTelemetry is on but names no endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, or"
                  " AIRFLOW__METRICS__OTEL_HOST and _PORT); no metrics from this command")
        return None
    endpoint = f"{'https' if _on('OTEL_SSL_ACTIVE') else 'http'}://{host}:{port}/v1/metrics"
    return OTLPMetricExporter(endpoint=endpoint, timeout=timeout), endpoint


@functools.cache
def from_environment() -> Stats | None:
    """The CLI's client, from Airflow's `[metrics]` variables (StatsD first, as Airflow chooses); None
    when metrics are off (or cannot be)."""
    if not _on("STATSD_ON"):
        if not _on("OTEL_ON"):
            return None
        try:
            chosen = _otlp_exporter()
            if chosen is None:
                return None
            exporter, endpoint = chosen
            return OtelStats(exporter, os.environ.get("AIRFLOW__METRICS__OTEL_PREFIX", "airflow"), endpoint)
        except Exception as exc:  # noqa: BLE001 - a bad setting costs the metrics, never the batch
            _say_once(f"metrics: OpenTelemetry unusable ({exc}); no metrics from this command")
            return None
    env = os.environ.get
    host, port = env("AIRFLOW__METRICS__STATSD_HOST", "localhost"), env("AIRFLOW__METRICS__STATSD_PORT", "8125")
    try:
        return StatsdStats(host, int(port), env("AIRFLOW__METRICS__STATSD_PREFIX", "airflow"),
                           _on("STATSD_INFLUXDB_ENABLED"))
    except Exception as exc:  # noqa: BLE001 - e.g. a host that does not resolve: no metrics, the batch goes on
        _say_once(f"metrics: StatsD at {host}:{port} unusable ({exc}); no metrics from this command")
        return None


def _say_once(message: str, key: str | None = None) -> None:
    """Log `message` the first time its `key` (by default the message itself) is seen in this process."""
    key = message if key is None else key
    if key not in _warned:
        _warned.add(key)
        log.warning(message)
