"""The Schema Registry: writer schemas by id, fetched once per id and worker, and what its errors mean.

Values in the Confluent wire format start with a header: magic byte 0 and the 4-byte big-endian id
of the schema that wrote them. A registry's schema ids are global and never change what they name,
so a worker keeps every schema it fetched for as long as it lives (Spark reuses Python workers from
task to task and batch to batch). The client is confluent-kafka's; its settings come from the
pipeline's connection (`kafka_batch.connections.schema_registry_config`).

What a registry answers decides the kind of error: an id it does not know is a bad record (the
record is quarantined); refused credentials are bad input (never retried); no answer, or a server
error, is a service error (retried; nothing is committed meanwhile).
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlsplit

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from kafka_batch.errors import InputError, ServiceError

MAGIC = 0
HEADER_BYTES = 5

# The HTTP client logs every request at INFO: one line per batch and worker, about nothing.
for _name in ("httpx", "httpx2"):
    logging.getLogger(_name).setLevel(logging.WARNING)

_cache: dict[tuple[str, int], Any] = {}
_clients: dict[str, SchemaRegistryClient] = {}
_lock = threading.Lock()


class UnknownSchema(Exception):
    """The registry has no schema of that id, or not one of the expected kind: the record is bad."""


def header_problem(value: bytes) -> str | None:
    """Why a value is not in the Confluent wire format, or None."""
    if len(value) < HEADER_BYTES:
        return f"not in the Confluent wire format: {len(value)} byte(s), its header alone is {HEADER_BYTES}"
    if value[0] != MAGIC:
        return f"not in the Confluent wire format: first byte 0x{value[0]:02x}, expected magic byte 0x00"
    return None


def schema_id(value: bytes) -> int:
    return int.from_bytes(value[1:HEADER_BYTES], "big")


def _url(config: dict) -> str:
    """The (first) registry URL, without any credentials in it: for messages and cache keys."""
    parts = urlsplit(str(config.get("url", "")).split(",")[0])
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl() \
        if parts.hostname else parts.geturl()


def client(config: dict) -> SchemaRegistryClient:
    key = repr(sorted(config.items()))
    with _lock:
        if key not in _clients:
            _clients[key] = SchemaRegistryClient(dict(config))
        return _clients[key]


def fetch(config: dict, ident: int, kind: str, parse) -> Any:
    """The schema of id `ident`, `parse`d once per worker (`parse(schema_text, references)`); UnknownSchema
    when the registry does not have it or it is not a `kind` schema (AVRO, PROTOBUF)."""
    key = (_url(config), ident)
    found = _cache.get(key)
    if found is not None:
        return found
    registry = client(config)
    try:
        # Protobuf: the serialized form (a FileDescriptorProto), as Confluent's registry gives it on request.
        schema = registry.get_schema(ident, fmt="serialized" if kind == "PROTOBUF" else None)
        if (schema.schema_type or "AVRO") != kind:
            raise UnknownSchema(f"schema id {ident} is a {schema.schema_type} schema, not {kind}")
        references = {ref.name: registry.get_version(ref.subject, ref.version).schema.schema_str
                      for ref in schema.references or ()}
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise UnknownSchema(f"schema id {ident} is unknown to the registry ({exc.error_message})") from None
        raise registry_error(config, exc) from None
    except UnknownSchema:
        raise
    except Exception as exc:  # noqa: BLE001 - the client's transport errors (httpx) have no base of its own
        raise no_answer(config, exc) from None
    try:
        parsed = parse(schema.schema_str, references)
    except Exception as exc:  # noqa: BLE001 - a registered schema this project cannot read
        raise UnknownSchema(f"schema id {ident} cannot be used: {exc}") from None
    _cache[key] = parsed
    return parsed


def registry_error(config: dict, exc: SchemaRegistryError) -> Exception:
    """The project's error for a registry's answer: refused credentials are bad input, the rest may pass."""
    where = f"schema registry {_url(config)}"
    if exc.http_status_code in (401, 403):
        return InputError(f"{where} refused the connection's credentials (HTTP {exc.http_status_code}:"
                          f" {exc.error_message}); fix the schema registry connection")
    return ServiceError(f"{where} answered HTTP {exc.http_status_code}: {exc.error_message}")


def no_answer(config: dict, exc: Exception) -> ServiceError:
    return ServiceError(f"schema registry {_url(config)} did not answer: {type(exc).__name__}: {exc}")


def check(config: dict) -> None:
    """One request before a batch reads: a registry that refuses the credentials fails it at once
    (InputError) instead of in every task; one that does not answer is a ServiceError."""
    try:
        client(config).get_schema_types()
    except SchemaRegistryError as exc:
        raise registry_error(config, exc) from None
    except Exception as exc:  # noqa: BLE001 - transport errors
        raise no_answer(config, exc) from None
