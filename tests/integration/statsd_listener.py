"""A real StatsD endpoint for tests: a UDP socket on loopback that keeps every line it receives, and the
AIRFLOW__METRICS__* settings (tags on the line, InfluxDB style) that point Airflow and the CLI at it."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Received:
    name: str
    tags: dict[str, str]
    value: float
    kind: str  # c, g, ms


class StatsdListener:
    PREFIX = "kbtest"

    def __init__(self):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._socket.recv(65_536)
            except TimeoutError:
                continue
            self.lines.extend(line for line in data.decode().split("\n") if line)

    def env(self) -> dict[str, str]:
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port), "AIRFLOW__METRICS__STATSD_PREFIX": self.PREFIX,
                "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}

    def received(self, prefix: str = "kafka_batch.", settle: float = 0.5) -> list[Received]:
        """The points under `prefix` (after Airflow's), parsed: `name,tag=v,...:value|type`."""
        time.sleep(settle)  # UDP: what was sent is in the socket's buffer, the thread reads it soon after
        points = []
        for line in list(self.lines):
            head, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            name, *tags = head.split(",")
            name = name.removeprefix(self.PREFIX + ".")
            if name.startswith(prefix):
                points.append(Received(name, dict(t.split("=", 1) for t in tags), float(value), kind.split("|")[0]))
        return points

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()
