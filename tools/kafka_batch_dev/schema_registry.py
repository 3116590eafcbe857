"""A local Schema Registry: the part of Confluent's REST API that producers' serializers and this project use.

No Schema Registry installs on these machines, so `kafka-batch local up` runs this one; compose runs
Confluent's. It implements: registering a schema under a subject (`POST /subjects/{s}/versions`, the
same schema text gets the same id everywhere), looking one up (`POST /subjects/{s}`), a schema by id
(`GET /schemas/ids/{id}`, and `/schemas/ids/{id}/versions`), subjects and their versions
(`GET /subjects`, `/subjects/{s}/versions`, `/subjects/{s}/versions/{v|latest}`), `GET /schemas/types`
and `GET /config` (BACKWARD). Avro schemas are checked as Avro; references are kept. It does not check
compatibility between versions, delete, or keep modes and contexts. With `--basic-auth user:password`
every request must carry those credentials (401 otherwise). Schemas are kept in a JSON file, so ids
survive a restart.

    python -m kafka_batch_dev.schema_registry --port 8081 --data DIR [--basic-auth user:password]
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
TYPES = ("AVRO", "PROTOBUF", "JSON")


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Schemas:
    """Schemas by id and subjects' versions, kept in `path` (a JSON file) when given."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.lock = threading.Lock()
        self.schemas: list[dict] = []            # id i + 1 -> {schema, schemaType, references}
        self.subjects: dict[str, list[int]] = {}  # subject -> ids of versions 1, 2, ...
        if path is not None and path.exists():
            saved = json.loads(path.read_text())
            self.schemas, self.subjects = saved["schemas"], saved["subjects"]

    def _save(self) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"schemas": self.schemas, "subjects": self.subjects}))
            tmp.replace(self.path)

    def _normal(self, body: dict) -> dict:
        kind = body.get("schemaType") or "AVRO"
        if kind not in TYPES:
            raise RegistryError(422, 42201, f"unknown schema type {kind}")
        text = body.get("schema")
        if not isinstance(text, str):
            raise RegistryError(422, 42201, "no schema")
        if kind == "AVRO":
            try:
                parsed = json.loads(text)
                from fastavro import parse_schema

                named: dict = {}
                for ref in body.get("references") or []:
                    referenced = self.version(ref["subject"], str(ref["version"]))["schema"]
                    parse_schema(json.loads(referenced), named_schemas=named)
                parse_schema(parsed, named_schemas=named)
            except Exception as exc:  # noqa: BLE001 - any parse failure is an invalid schema
                raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
            text = json.dumps(parsed, separators=(",", ":"))
        references = [{"name": r["name"], "subject": r["subject"], "version": r["version"]}
                      for r in body.get("references") or []]
        return {"schema": text, "schemaType": kind, "references": references}

    def register(self, subject: str, body: dict) -> dict:
        entry = self._normal(body)
        with self.lock:
            ident = self._id_of(entry)
            if ident is None:
                self.schemas.append(entry)
                ident = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if ident not in versions:
                versions.append(ident)
            self._save()
            return {"id": ident, "subject": subject, "version": versions.index(ident) + 1}

    def lookup(self, subject: str, body: dict) -> dict:
        entry = self._normal(body)
        with self.lock:
            versions = self._versions(subject)
            ident = self._id_of(entry)
            if ident is None or ident not in versions:
                raise RegistryError(404, 40403, "Schema not found")
            return self._version(subject, versions.index(ident) + 1)

    def _id_of(self, entry: dict) -> int | None:
        return next((i + 1 for i, e in enumerate(self.schemas) if e == entry), None)

    def _versions(self, subject: str) -> list[int]:
        if subject not in self.subjects:
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        return self.subjects[subject]

    def by_id(self, ident: int) -> dict:
        if not 1 <= ident <= len(self.schemas):
            raise RegistryError(404, 40403, "Schema not found")
        return _shown(self.schemas[ident - 1])

    def _version(self, subject: str, version: str | int) -> dict:
        versions = self._versions(subject)
        number = len(versions) if version in ("latest", "-1", -1) else int(version)
        if not 1 <= number <= len(versions):
            raise RegistryError(404, 40402, f"Version {version} not found.")
        ident = versions[number - 1]
        return {"subject": subject, "version": number, "id": ident, **_shown(self.schemas[ident - 1])}

    def version(self, subject: str, version: str) -> dict:
        with self.lock:
            return self._version(subject, version)

    def versions_of_id(self, ident: int) -> list[dict]:
        self.by_id(ident)
        with self.lock:
            return [{"subject": s, "version": v.index(ident) + 1} for s, v in self.subjects.items() if ident in v]


def _shown(entry: dict) -> dict:
    """A schema as Confluent's registry shows it: no schemaType for Avro, no empty references."""
    shown = {"schema": entry["schema"]}
    if entry["schemaType"] != "AVRO":
        shown["schemaType"] = entry["schemaType"]
    if entry["references"]:
        shown["references"] = entry["references"]
    return shown


_ROUTES = [
    ("GET", r"/schemas/types", lambda s, m, q, b: list(TYPES)),
    ("GET", r"/schemas/ids/(\d+)", lambda s, m, q, b: s.by_id(int(m[1]))),
    ("GET", r"/schemas/ids/(\d+)/versions", lambda s, m, q, b: s.versions_of_id(int(m[1]))),
    ("GET", r"/subjects", lambda s, m, q, b: sorted(s.subjects)),
    ("GET", r"/subjects/([^/]+)/versions", lambda s, m, q, b: list(range(1, len(s._versions(unquote(m[1]))) + 1))),
    ("GET", r"/subjects/([^/]+)/versions/([^/]+)", lambda s, m, q, b: s.version(unquote(m[1]), m[2])),
    ("GET", r"/subjects/([^/]+)/versions/([^/]+)/schema", lambda s, m, q, b: s.version(unquote(m[1]), m[2])["schema"]),
    ("POST", r"/subjects/([^/]+)/versions", lambda s, m, q, b: s.register(unquote(m[1]), b)),
    ("POST", r"/subjects/([^/]+)", lambda s, m, q, b: s.lookup(unquote(m[1]), b)),
    ("GET", r"/config(?:/[^/]+)?", lambda s, m, q, b: {"compatibilityLevel": "BACKWARD"}),
    ("GET", r"/", lambda s, m, q, b: {}),
]


def handler(schemas: Schemas, credentials: str | None) -> type[BaseHTTPRequestHandler]:
    expected = None if credentials is None else "Basic " + base64.b64encode(credentials.encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kafka-batch-local-schema-registry"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if expected is not None and self.headers.get("Authorization") != expected:
                self._answer(401, {"error_code": 401, "message": "Unauthorized"})
                return
            parts = urlsplit(self.path)
            path = parts.path.rstrip("/") or "/"
            for verb, pattern, action in _ROUTES:
                match = re.fullmatch(pattern, path)
                if verb == method and match:
                    try:
                        body = json.loads(raw) if raw else {}
                        self._answer(200, action(schemas, match, parse_qs(parts.query), body))
                    except RegistryError as exc:
                        self._answer(exc.status, {"error_code": exc.code, "message": exc.message})
                    except json.JSONDecodeError:
                        self._answer(400, {"error_code": 400, "message": "request body is not JSON"})
                    return
            self._answer(HTTPStatus.NOT_FOUND, {"error_code": 404, "message": f"HTTP 404 Not Found: {path}"})

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

    return Handler


def serve(port: int, data: Path | None = None, credentials: str | None = None,
          host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A registry answering on host:port (0: a free port); `serve_forever` it, or run it in a thread."""
    if data is not None:
        data.mkdir(parents=True, exist_ok=True)
    schemas = Schemas(None if data is None else data / "schemas.json")
    server = ThreadingHTTPServer((host, port), handler(schemas, credentials))
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True, help="where the schemas are kept")
    parser.add_argument("--basic-auth", help="user:password every request must carry")
    args = parser.parse_args(argv)
    serve(args.port, args.data, args.basic_auth).serve_forever()


if __name__ == "__main__":
    main()
