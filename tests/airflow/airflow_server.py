"""A real Airflow for the console tests, started as `make airflow` starts it: on a free loopback port, with
the project's plugin, the simple auth manager (its admin user and generated password) and the test
services' connections. Stopped at the end; nothing is left listening.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kafka_batch_dev import local_stack


@dataclass(frozen=True)
class Server:
    url: str  # ends with "/"
    username: str
    password: str
    log: Path

    def token(self) -> str:
        """A JWT from the auth manager's token endpoint, as the UI's login form gets one."""
        request = urllib.request.Request(
            self.url + "auth/token", data=json.dumps({"username": self.username, "password": self.password}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["access_token"]

    def get(self, path: str, token: str | None = None, cookie: str | None = None, timeout: float = 60) -> tuple[int, str]:
        """(status, body) of a GET; no redirect is followed."""
        return self.call("GET", path, token=token, cookie=cookie, timeout=timeout)

    def call(self, method: str, path: str, body: dict | None = None, token: str | None = None,
             cookie: str | None = None, timeout: float = 60) -> tuple[int, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if cookie:
            headers["Cookie"] = f"_token={cookie}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@contextmanager
def airflow(extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """Airflow as `make airflow` starts it (api-server, scheduler, dag-processor, triggerer), on the test
    services and a free loopback port; every component is stopped at the end."""
    base = Path(os.environ["AIRFLOW_HOME"]).parent
    state = local_stack.read_state(base)
    state["airflow_port"] = local_stack.free_port()
    connections = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_")}
    try:
        url = local_stack.start_airflow(base, state, {**connections, **(extra_env or {})})
        yield Server(url, *local_stack.airflow_login(base), base / "airflow-api-server.log")
    finally:
        left = local_stack.stop_airflow(state)
        assert not left, f"Airflow processes survived: {left}"
