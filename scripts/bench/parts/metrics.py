"""The `metrics` part: a backend that is down must not slow a batch (target 12)."""

from __future__ import annotations

import argparse
import http.server
import threading

from bench.env import CONNECT, Env
from bench.harness import row, settle
from bench.runs import cli_run
from kafka_batch_dev import sample_data


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes every export and keeps nothing: a backend that is up."""

    def do_POST(self):  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """A small batch with metrics off, on and on with the backend down, for StatsD and OpenTelemetry,
    in interleaved rounds: a backend that is down must not slow a batch (target 12)."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # receives and drops: a backend that is up
    listener.bind(("127.0.0.1", 0))
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    with socket.socket() as unused:  # a port nobody listens on: an OpenTelemetry collector that is down
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    statsd = {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}
    otel = {"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1"}
    cases = {"metrics off": {}, "metrics on": {**statsd, "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                                               "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1])},
             "metrics backend down": {**statsd, "AIRFLOW__METRICS__STATSD_HOST": "statsd.invalid"},
             "OpenTelemetry on": {**otel, "AIRFLOW__METRICS__OTEL_PORT": str(collector.server_address[1])},
             "OpenTelemetry backend down": {**otel, "AIRFLOW__METRICS__OTEL_PORT": str(closed)}}
    topic = f"{env.prefix}_metrics"
    sample_data.ensure_topic(env.kafka, topic, 1)
    pipeline = env.pipeline("metrics", topic, CONNECT)
    sample_data.produce_page_views(env.kafka, topic, args.fixed_records, seed=4)
    cli_run(pipeline)  # the session's first batch starts its Python workers
    best = {}
    try:
        for n in range(args.repeat):
            for label, variables in cases.items():
                sample_data.produce_page_views(env.kafka, topic, args.fixed_records, seed=40 + n)
                settle()
                seconds, breakdown = cli_run(pipeline, env=variables)
                best[label] = row(f"batch, {label}", seconds, "s", f"kafka-batch run of {args.fixed_records:,}"
                                  f" records, Spark Connect; phases {breakdown}", phases=breakdown)["value"]
    finally:
        listener.close()
        collector.shutdown()
    return [("12 batch with the StatsD backend down / up <= 1.05", best["metrics backend down"] / best["metrics on"],
             1.05, "<="),
            ("12 same, OpenTelemetry", best["OpenTelemetry backend down"] / best["OpenTelemetry on"], 1.05, "<=")]
