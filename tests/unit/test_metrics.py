"""kafka_batch.observability.metrics' pure parts: a batch's points from its ledger row, a failure's, the lag's age, the
StatsD line the CLI writes (Airflow's format), and the alerts' bounds."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

from kafka_batch.config import Alerts
from kafka_batch.errors import FencedAttempt, InputError
from kafka_batch.observability import metrics

FACTS = {"pipeline": "p", "kind": "batch", "status": "committed", "attempt": 3, "records_read": 90,
         "records_tombstone": 4, "records_invalid": 6, "read_seconds": 2.0, "commit_seconds": 0.5,
         "execute_seconds": 4.0, "offsets_lost": {("t", 1): 17},
         "published": {"out": {"messages": 94, "seconds": 0.25}, "log": {"messages": 3, "seconds": 0.5}}}


def _by_name(points):
    return {(p.name, p.tags.get("phase")): p for p in points}


def test_a_committed_batchs_points_come_from_its_ledger_row():
    points = _by_name(metrics.batch_points(FACTS))
    assert points[("batch.records_read", None)].value == 100
    assert points[("batch.records_committed", None)].value == 94
    assert points[("batch.records_quarantined", None)].value == 6
    assert points[("batch.retries", None)].value == 2
    assert points[("batch.records_per_second", None)].value == 50
    assert {phase: points[("batch.duration", phase)].value for phase in ("read", "commit", "publish", "execute")} == {
        "read": 2000, "commit": 500, "publish": 750, "execute": 4000}
    assert sorted((p.value, p.tags["topic"]) for p in metrics.batch_points(FACTS)
                  if p.name == "batch.messages_published") == [(3, "log"), (94, "out")]
    unpublished = _by_name(metrics.batch_points({**FACTS, "published": {}}))
    assert ("batch.duration", "publish") not in unpublished and ("batch.messages_published", None) not in unpublished
    lost = points[("data_loss.offsets", None)]
    assert (lost.value, dict(lost.tags)) == (17, {"pipeline": "p", "topic": "t", "partition": "1"})
    assert all(p.tags["pipeline"] == "p" for p in points.values())


def test_a_lost_race_counts_as_fenced_and_bad_input_does_not():
    fenced = metrics.failure_points("p", "replay", FencedAttempt("newer attempt"))
    assert [(p.name, dict(p.tags)) for p in fenced] == [
        ("batch.failed", {"pipeline": "p", "kind": "replay", "error": "fencedattempt"}),
        ("batch.fenced", {"pipeline": "p", "kind": "replay"})]
    assert [p.name for p in metrics.failure_points("p", "batch", InputError("bad"))] == ["batch.failed"]


def test_the_lags_age_is_the_oldest_unread_records_and_zero_when_nothing_is_unread():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    points = metrics.lag_points("p", [
        {"topic": "t", "partition": 0, "lag": 5, "oldest_unread_at": now - timedelta(seconds=30)},
        {"topic": "t", "partition": 1, "lag": 0, "oldest_unread_at": None},
        {"topic": "u", "partition": 0, "lag": 2, "oldest_unread_at": now - timedelta(seconds=50)},
        {"topic": "t", "partition": 2, "lag": 3, "oldest_unread_at": now - timedelta(seconds=10)},
    ], now)
    # Per topic first: the sum of its lags, its oldest unread record, its partitions behind.
    assert [(p.name, p.tags, p.value) for p in points[:6]] == [
        ("topic.lag.records", {"pipeline": "p", "topic": "t"}, 8), ("topic.lag.seconds", {"pipeline": "p", "topic": "t"}, 30),
        ("topic.partitions_behind", {"pipeline": "p", "topic": "t"}, 2),
        ("topic.lag.records", {"pipeline": "p", "topic": "u"}, 2), ("topic.lag.seconds", {"pipeline": "p", "topic": "u"}, 50),
        ("topic.partitions_behind", {"pipeline": "p", "topic": "u"}, 1)]
    assert [(p.name, p.tags["topic"], p.tags["partition"], p.value) for p in points[6:]] == [
        ("lag.records", "t", "0", 5), ("lag.seconds", "t", "0", 30), ("lag.records", "t", "1", 0),
        ("lag.seconds", "t", "1", 0), ("lag.records", "u", "0", 2), ("lag.seconds", "u", "0", 50),
        ("lag.records", "t", "2", 3), ("lag.seconds", "t", "2", 10)]


def test_the_cli_writes_airflows_statsd_lines_with_the_tags_on_them():
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    try:
        stats = metrics.StatsdStats("127.0.0.1", receiver.getsockname()[1], "airflow", influxdb_tags=True)
        metrics.send(stats, metrics.plan_points("p", "batch", 0.25))
        metrics.send(stats, [metrics.Point("lag.records", 7, {"pipeline": "p", "topic": "a,b", "partition": "0"})])
        lines = [receiver.recv(1024).decode() for _ in range(2)]
    finally:
        receiver.close()
    assert lines == ["airflow.kafka_batch.batch.duration,pipeline=p,kind=batch,phase=plan:250.000000|ms",
                     "airflow.kafka_batch.lag.records,pipeline=p,partition=0:7|g"]  # a tag with a comma is dropped


def test_the_cli_sends_opentelemetry_where_airflow_would(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "AIRFLOW__METRICS__OTEL_SSL_ACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_HOST", "collector")
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_PORT", "4318")
    assert metrics._otlp_exporter()[1] == "http://collector:4318/v1/metrics"  # Airflow's otel_host and otel_port
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_SSL_ACTIVE", "True")
    assert metrics._otlp_exporter()[1] == "https://collector:4318/v1/metrics"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318")  # the standard variables come first
    exporter, endpoint = metrics._otlp_exporter()
    assert endpoint == "http://otel:4318" and type(exporter).__module__.endswith("proto.http.metric_exporter")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert type(metrics._otlp_exporter()[0]).__module__.endswith("proto.grpc.metric_exporter")


def test_a_backend_that_raises_is_said_once_and_never_raised(caplog):
    class Down:
        def incr(self, *args, **kwargs):
            raise OSError("no route")

    metrics.send(Down(), metrics.batch_points(FACTS) + metrics.batch_points(FACTS))
    assert [r.getMessage() for r in caplog.records].count(
        "metrics: could not send kafka_batch.batch.committed (OSError: no route); going on without it") == 1


def test_alerts_name_each_bound_that_is_over():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    alerts = Alerts(max_lag_records=100, max_lag_seconds=60)
    assert alerts.breaches(100, now - timedelta(seconds=60), now) == []
    assert alerts.breaches(101, now - timedelta(seconds=61), now) == [
        "lag 101 records over max_lag_records 100", "oldest unread record 61 s old, over max_lag_seconds 60"]
    assert alerts.breaches(0, now - timedelta(days=1), now) == []  # nothing unread: no age
