"""A real OpenTelemetry endpoint for tests: an OTLP/HTTP receiver on loopback that keeps every metric
data point posted to /v1/metrics (protobuf, as the SDK's exporter sends it), and the AIRFLOW__METRICS__*
settings that point Airflow and the CLI at it. Points come out in the StatsD listener's shape."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.integration.statsd_listener import Received


class OtlpListener:
    PREFIX = "kbtest"

    def __init__(self):
        self.requests: list[ExportMetricsServiceRequest] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/metrics":
                    request = ExportMetricsServiceRequest()
                    request.ParseFromString(body)
                    listener.requests.append(request)
                self.send_response(200 if self.path == "/v1/metrics" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        return {"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__OTEL_PORT": str(self.port), "AIRFLOW__METRICS__OTEL_PREFIX": self.PREFIX}

    def received(self, prefix: str = "kafka_batch.", settle: float = 0.0) -> list[Received]:
        """The data points under `prefix` (after Airflow's): a counter's sum, a gauge's value, a histogram's
        sum when it holds one observation (a timing)."""
        time.sleep(settle)
        points = []
        for request in list(self.requests):
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        name = metric.name.removeprefix(self.PREFIX + ".")
                        if name.startswith(prefix):
                            points += [Received(name, tags, value, kind) for tags, value, kind in _values(metric)]
        return points

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _number(point) -> float:
    return point.as_int if point.HasField("as_int") else point.as_double


def _tags(point) -> dict[str, str]:
    return {a.key: a.value.string_value for a in point.attributes}


def _values(metric):
    kind = metric.WhichOneof("data")
    if kind == "sum":
        return [(_tags(p), _number(p), "c") for p in metric.sum.data_points]
    if kind == "gauge":
        return [(_tags(p), _number(p), "g") for p in metric.gauge.data_points]
    histogram = metric.exponential_histogram if kind == "exponential_histogram" else metric.histogram
    points = []
    for p in histogram.data_points:
        assert p.count == 1, f"{metric.name}: {p.count} observations where a batch makes one"
        points.append((_tags(p), p.sum, "ms"))
    return points
