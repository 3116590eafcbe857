"""A local Schema Registry: the part of Confluent's REST API that producers' serializers and this project use.

No Schema Registry installs on these machines (Apicurio's, on Maven Central, does not resolve there), so
`kafka-batch local up` runs this one; compose runs Confluent's. It implements: registering a schema under
a subject (`POST /subjects/{s}/versions`, the same schema text gets the same id everywhere), looking one
up (`POST /subjects/{s}`), a schema by id (`GET /schemas/ids/{id}`, and `/schemas/ids/{id}/versions`),
subjects and their versions (`GET /subjects`, `/subjects/{s}/versions`, `/subjects/{s}/versions/{v|latest}`),
`GET /schemas/types`; compatibility as Confluent's registry keeps it: the global and per-subject levels
(`GET|PUT /config`, `GET|PUT|DELETE /config/{s}`; BACKWARD by default, FORWARD, FULL, NONE and the
transitive ones), checked on every registration of a new Avro schema with Apache Avro's own checker
(`avro.compatibility`; a refusal is 409 with Confluent's error code and the rule in its message), and
asked with `POST /compatibility/subjects/{s}/versions[/{v}]`; modes (`GET|PUT /mode[/{s}]`: READWRITE,
READONLY, which refuses registrations); soft and permanent deletes of subjects and versions
(`DELETE /subjects/{s}[/versions/{v}][?permanent=true]`), a deleted version's number never reused. Avro
schemas are checked as Avro; references are kept. Protobuf and JSON Schema subjects, and Avro schemas
with references, are registered without a compatibility check (Confluent's checks them too). With
`--basic-auth user:password` every request must carry those credentials (401 otherwise). Everything is
kept in a JSON file, so ids, levels and deletes survive a restart.

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
LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
MODES = ("READWRITE", "READONLY")
GLOBAL = ""  # the key of the registry-wide level and mode


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def incompatibilities(level: str, new: dict, earlier: list[dict]) -> list[str]:
    """Why `new` breaks `level` against the earlier versions' schemas (newest last): Avro's reader-writer
    check, the new schema reading the earlier ones' data (backward), the earlier ones reading the new
    one's (forward), or both (full); against the newest only, or every one (transitive). Empty: compatible."""
    if level == "NONE" or not earlier or new["schemaType"] != "AVRO" or new["references"]:
        return []
    import avro.schema
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    checker = ReaderWriterCompatibilityChecker()
    try:
        candidate = avro.schema.parse(new["schema"])
    except Exception as exc:  # noqa: BLE001 - Avro's own parser refusing what fastavro took
        raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
    problems = []
    for old in earlier if level.endswith("_TRANSITIVE") else earlier[-1:]:
        if old["schemaType"] != "AVRO" or old["references"]:
            continue
        previous = avro.schema.parse(old["schema"])
        pairs = {"BACKWARD": [(candidate, previous)], "FORWARD": [(previous, candidate)],
                 "FULL": [(candidate, previous), (previous, candidate)]}[level.removesuffix("_TRANSITIVE")]
        for reader, writer in pairs:
            result = checker.get_compatibility(reader, writer)
            if result.compatibility is not SchemaCompatibilityType.compatible:
                kinds = sorted(kind.name.upper() for kind in result.incompatibilities)
                problems.append(f"{{errorType:'{', '.join(kinds)}', description:'{'; '.join(sorted(result.messages))}'"
                                f" at '{', '.join(sorted(result.locations))}'}}, {{oldSchemaVersion: {old['version']}}}")
    return problems


class Schemas:
    """Schemas by id; subjects' versions (soft-deleted ones kept, marked); compatibility levels and modes,
    global and per subject: kept in `path` (a JSON file) when given."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.lock = threading.Lock()
        self.schemas: list[dict] = []  # id i + 1 -> {schema, schemaType, references}
        self.subjects: dict[str, list[dict]] = {}  # subject -> [{version, id, deleted}], oldest first
        self.config: dict[str, str] = {GLOBAL: "BACKWARD"}
        self.mode: dict[str, str] = {GLOBAL: "READWRITE"}
        if path is not None and path.exists():
            saved = json.loads(path.read_text())
            self.schemas = saved["schemas"]
            self.subjects = {subject: [v if isinstance(v, dict) else {"version": n, "id": v, "deleted": False}
                                       for n, v in enumerate(versions, 1)]  # files of before deletes: ids
                             for subject, versions in saved["subjects"].items()}
            self.config.update(saved.get("config", {}))
            self.mode.update(saved.get("mode", {}))

    def _save(self) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"schemas": self.schemas, "subjects": self.subjects, "config": self.config,
                                       "mode": self.mode}))
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
                    referenced = self._version(ref["subject"], str(ref["version"]))["schema"]
                    parse_schema(json.loads(referenced), named_schemas=named)
                parse_schema(parsed, named_schemas=named)
            except RegistryError:
                raise
            except Exception as exc:  # noqa: BLE001 - any parse failure is an invalid schema
                raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
            text = json.dumps(parsed, separators=(",", ":"))
        references = [{"name": r["name"], "subject": r["subject"], "version": r["version"]}
                      for r in body.get("references") or []]
        return {"schema": text, "schemaType": kind, "references": references}

    def _live(self, subject: str) -> list[dict]:
        return [v for v in self.subjects.get(subject, []) if not v["deleted"]]

    def _with_number(self, version: dict) -> dict:
        """A version's schema entry with its version number, as `incompatibilities` takes it."""
        return {**self.schemas[version["id"] - 1], "version": version["version"]}

    def _earlier(self, subject: str) -> list[dict]:
        """The live versions' schemas, oldest first, each with its version number."""
        return [self._with_number(v) for v in self._live(subject)]

    def register(self, subject: str, body: dict) -> dict:
        with self.lock:
            entry = self._normal(body)
            if self._setting(self.mode, subject) == "READONLY":
                raise RegistryError(422, 42205, f"Subject {subject} is in read-only mode")
            ident = self._id_of(entry)
            live = self._live(subject)
            known = next((v for v in live if v["id"] == ident), None)
            if known is not None:
                return {"id": ident, "subject": subject, "version": known["version"]}
            level = self._setting(self.config, subject)
            problems = incompatibilities(level, entry, self._earlier(subject))
            if problems:
                raise RegistryError(409, 409, f'Schema being registered is incompatible with an earlier schema for'
                                              f' subject "{subject}", details: [{", ".join(problems)},'
                                              f" {{compatibility: '{level}'}}]")
            if ident is None:
                self.schemas.append(entry)
                ident = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            number = max((v["version"] for v in versions), default=0) + 1  # a deleted version's number is not reused
            versions.append({"version": number, "id": ident, "deleted": False})
            self._save()
            return {"id": ident, "subject": subject, "version": number}

    def compatibility(self, subject: str, version: str | None, body: dict, query: dict) -> dict:
        """Whether `body` may be registered under the subject: against one version (`version`), else
        against what registration would check."""
        with self.lock:
            entry = self._normal(body)
            level = self._setting(self.config, subject)
            if version is None:
                earlier = self._earlier(subject)
            else:
                earlier = [self._with_number(self._version(subject, version))]
                level = level.removesuffix("_TRANSITIVE")
            problems = incompatibilities(level, entry, earlier)
        answer: dict[str, Any] = {"is_compatible": not problems}
        if query.get("verbose") == ["true"]:
            answer["messages"] = problems
        return answer

    def lookup(self, subject: str, body: dict) -> dict:
        with self.lock:
            entry = self._normal(body)
            versions = self._versions(subject)
            ident = self._id_of(entry)
            found = next((v for v in versions if v["id"] == ident), None)
            if found is None:
                raise RegistryError(404, 40403, "Schema not found")
            return self._version(subject, found["version"])

    def _id_of(self, entry: dict) -> int | None:
        return next((i + 1 for i, e in enumerate(self.schemas) if e == entry), None)

    def _versions(self, subject: str) -> list[dict]:
        live = self._live(subject)
        if not live:
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        return live

    def subject_names(self, query: dict) -> list[str]:
        deleted = query.get("deleted") == ["true"]
        with self.lock:
            return sorted(s for s, versions in self.subjects.items() if versions and (deleted or self._live(s)))

    def version_numbers(self, subject: str) -> list[int]:
        with self.lock:
            return [v["version"] for v in self._versions(subject)]

    def by_id(self, ident: int) -> dict:
        if not 1 <= ident <= len(self.schemas):
            raise RegistryError(404, 40403, "Schema not found")
        return _shown(self.schemas[ident - 1])

    def _version(self, subject: str, version: str | int) -> dict:
        versions = self._versions(subject)
        if version in ("latest", "-1", -1):
            found = versions[-1]
        else:
            number = _number(version)
            found = next((v for v in versions if v["version"] == number), None)
            if found is None:
                raise RegistryError(404, 40402, f"Version {version} not found.")
        return {"subject": subject, "version": found["version"], "id": found["id"], **_shown(self.schemas[found["id"] - 1])}

    def version(self, subject: str, version: str) -> dict:
        with self.lock:
            return self._version(subject, version)

    def versions_of_id(self, ident: int) -> list[dict]:
        self.by_id(ident)
        with self.lock:
            return [{"subject": s, "version": v["version"]} for s in self.subjects for v in self._live(s) if v["id"] == ident]

    def delete(self, subject: str, version: str | None, query: dict) -> list[int] | int:
        """Soft delete (hidden, its number kept), or with permanent=true remove what was soft-deleted."""
        permanent = query.get("permanent") == ["true"]
        with self.lock:
            versions = self.subjects.get(subject, [])
            if not versions:
                raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
            if version is None:  # a soft delete hides the live versions; a permanent one removes them all
                chosen = versions if permanent else [v for v in versions if not v["deleted"]] or versions
            else:
                number = versions[-1]["version"] if version == "latest" else _number(version)
                chosen = [v for v in versions if v["version"] == number]
                if not chosen:
                    raise RegistryError(404, 40402, f"Version {version} not found.")
            if permanent:
                live = [v for v in chosen if not v["deleted"]]
                if live:
                    raise RegistryError(404, 40405 if version is None else 40407,
                                        f"Subject '{subject}' {'' if version is None else f'Version {version} '}"
                                        "was not deleted first before being permanently deleted")
                self.subjects[subject] = [v for v in versions if v not in chosen]
                if not self.subjects[subject]:
                    del self.subjects[subject]
                    self.config.pop(subject, None)
                    self.mode.pop(subject, None)
            else:
                if all(v["deleted"] for v in chosen):
                    raise RegistryError(404, 40404 if version is None else 40406,
                                        f"Subject '{subject}' {'' if version is None else f'Version {version} '}"
                                        "was soft deleted. Set permanent=true to delete permanently")
                for v in chosen:
                    v["deleted"] = True
            self._save()
            numbers = [v["version"] for v in chosen]
            return numbers if version is None else numbers[0]

    @staticmethod
    def _setting(settings: dict[str, str], subject: str) -> str:
        return settings.get(subject) or settings[GLOBAL]

    def get_config(self, subject: str, query: dict) -> dict:
        with self.lock:
            if subject != GLOBAL and subject not in self.config and query.get("defaultToGlobal") != ["true"]:
                raise _no_subject_level(subject)
            return {"compatibilityLevel": self._setting(self.config, subject)}

    def set_config(self, subject: str, body: dict) -> dict:
        level = str(body.get("compatibility", "")).upper()
        if level not in LEVELS:
            raise RegistryError(422, 42203, "Invalid compatibility level. Valid values are none, backward, forward,"
                                            " full, backward_transitive, forward_transitive, and full_transitive")
        with self.lock:
            self.config[subject] = level
            self._save()
        return {"compatibility": level}

    def delete_config(self, subject: str) -> dict:
        with self.lock:
            if subject not in self.config:
                raise _no_subject_level(subject)
            level = self.config.pop(subject)
            self._save()
        return {"compatibilityLevel": level}

    def get_mode(self, subject: str) -> dict:
        with self.lock:
            return {"mode": self._setting(self.mode, subject)}

    def set_mode(self, subject: str, body: dict) -> dict:
        mode = str(body.get("mode", "")).upper()
        if mode not in MODES:
            raise RegistryError(422, 42204, f"Invalid mode. Valid values are {', '.join(MODES)}")
        with self.lock:
            self.mode[subject] = mode
            self._save()
        return {"mode": mode}


def _no_subject_level(subject: str) -> RegistryError:
    return RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")


def _number(version: str | int) -> int:
    try:
        return int(version)
    except ValueError:
        raise RegistryError(422, 42202, f"The specified version '{version}' is not a valid version id.") from None


def _shown(entry: dict) -> dict:
    """A schema as Confluent's registry shows it: no schemaType for Avro, no empty references."""
    shown = {"schema": entry["schema"]}
    if entry["schemaType"] != "AVRO":
        shown["schemaType"] = entry["schemaType"]
    if entry["references"]:
        shown["references"] = entry["references"]
    return shown


def _subject(match: re.Match) -> str:
    return unquote(match[1]) if match.lastindex else GLOBAL


_ROUTES = [
    ("GET", r"/schemas/types", lambda s, m, q, b: list(TYPES)),
    ("GET", r"/schemas/ids/(\d+)", lambda s, m, q, b: s.by_id(int(m[1]))),
    ("GET", r"/schemas/ids/(\d+)/versions", lambda s, m, q, b: s.versions_of_id(int(m[1]))),
    ("GET", r"/subjects", lambda s, m, q, b: s.subject_names(q)),
    ("GET", r"/subjects/([^/]+)/versions", lambda s, m, q, b: s.version_numbers(unquote(m[1]))),
    ("GET", r"/subjects/([^/]+)/versions/([^/]+)", lambda s, m, q, b: s.version(unquote(m[1]), m[2])),
    ("GET", r"/subjects/([^/]+)/versions/([^/]+)/schema", lambda s, m, q, b: s.version(unquote(m[1]), m[2])["schema"]),
    ("POST", r"/subjects/([^/]+)/versions", lambda s, m, q, b: s.register(unquote(m[1]), b)),
    ("POST", r"/subjects/([^/]+)", lambda s, m, q, b: s.lookup(unquote(m[1]), b)),
    ("DELETE", r"/subjects/([^/]+)", lambda s, m, q, b: s.delete(unquote(m[1]), None, q)),
    ("DELETE", r"/subjects/([^/]+)/versions/([^/]+)", lambda s, m, q, b: s.delete(unquote(m[1]), m[2], q)),
    ("POST", r"/compatibility/subjects/([^/]+)/versions", lambda s, m, q, b: s.compatibility(unquote(m[1]), None, b, q)),
    ("POST", r"/compatibility/subjects/([^/]+)/versions/([^/]+)",
     lambda s, m, q, b: s.compatibility(unquote(m[1]), m[2], b, q)),
    ("GET", r"/config(?:/([^/]+))?", lambda s, m, q, b: s.get_config(_subject(m), q)),
    ("PUT", r"/config(?:/([^/]+))?", lambda s, m, q, b: s.set_config(_subject(m), b)),
    ("DELETE", r"/config/([^/]+)", lambda s, m, q, b: s.delete_config(_subject(m))),
    ("GET", r"/mode(?:/([^/]+))?", lambda s, m, q, b: s.get_mode(_subject(m))),
    ("PUT", r"/mode(?:/([^/]+))?", lambda s, m, q, b: s.set_mode(_subject(m), b)),
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

        def do_PUT(self) -> None:  # noqa: N802
            self._handle("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._handle("DELETE")

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
