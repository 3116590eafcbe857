"""A client of a running Airflow's REST API (api/v2) and its auth manager's token endpoint, as the UI and a
user's script call them: the console tests and `make bench` drive Airflow through it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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
