"""A real Airflow api-server for the console tests: on a free loopback port, with the project's plugin,
the simple auth manager (a known user and password) and the test services' connections.

Stopped by its process group id at the end; nothing is left listening.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


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
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if cookie:
            headers["Cookie"] = f"_token={cookie}"
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, headers=headers), timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def api_server(home: Path, extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """`airflow api-server` with the environment of the running test services (os.environ)."""
    port = free_port()
    username, password = "operator", "pw-" + secrets.token_hex(8)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({username: password}))
    env = {
        **os.environ,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}/",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{username}:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        **(extra_env or {}),
    }
    log = home / "api-server.log"
    airflow = str(Path(sys.executable).parent / "airflow")
    with open(log, "ab") as out:
        proc = subprocess.Popen([airflow, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}/", username, password, log)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"api-server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if server.get("api/v2/monitor/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"api-server did not answer within 180s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
