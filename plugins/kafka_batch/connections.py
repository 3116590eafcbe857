"""Endpoints as Airflow connections, readable without Airflow.

The DAG resolves connections through Airflow (metadata DB, secrets backends, env) and hands them to
spark-submit as `AIRFLOW_CONN_*` variables in the child's environment only, never in arguments, logs
or XCom. The Spark driver, the CLI and the tests read the same variables with the parser below, so
executors never import Airflow.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kafka_batch.errors import InputError


def env_var(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


@dataclass(frozen=True)
class ConnectionFields:
    conn_id: str
    conn_type: str | None = None
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    schema: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_json(self) -> str:
        body = {
            "conn_type": self.conn_type, "host": self.host, "port": self.port, "login": self.login,
            "password": self.password, "schema": self.schema, "extra": self.extra,
        }
        return json.dumps({k: v for k, v in body.items() if v not in (None, {})})


def parse_connection(conn_id: str, value: str) -> ConnectionFields:
    """Parse Airflow's JSON or URI connection form."""
    value = value.strip()
    if value.startswith("{"):
        try:
            body = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InputError(f"connection {conn_id!r} ({env_var(conn_id)}): invalid JSON: {exc.msg}") from None
        extra = body.get("extra") or {}
        if isinstance(extra, str):
            extra = json.loads(extra)
        return ConnectionFields(
            conn_id=conn_id, conn_type=body.get("conn_type"), host=body.get("host"),
            port=int(body["port"]) if body.get("port") else None, login=body.get("login"),
            password=body.get("password"), schema=body.get("schema"), extra=extra,
        )
    parts = urlsplit(value)
    if not parts.scheme:
        raise InputError(f"connection {conn_id!r} ({env_var(conn_id)}): neither JSON nor a URI")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    extra = json.loads(query.pop("__extra__")) if "__extra__" in query else query
    return ConnectionFields(
        conn_id=conn_id,
        conn_type=parts.scheme.replace("-", "_"),
        host=unquote(parts.hostname) if parts.hostname else None,
        port=parts.port,
        login=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        schema=unquote(parts.path.lstrip("/")) or None,
        extra=extra,
    )


def from_environment(conn_id: str, environ: dict[str, str] | None = None) -> ConnectionFields:
    environ = os.environ if environ is None else environ
    value = environ.get(env_var(conn_id))
    if not value:
        raise InputError(
            f"connection {conn_id!r} is not defined: set {env_var(conn_id)} (Airflow connection URI or JSON)"
        )
    return parse_connection(conn_id, value)


def from_airflow(conn_id: str) -> ConnectionFields:
    """Resolve through Airflow, so connections from the UI or a secrets backend work too."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    return ConnectionFields(
        conn_id=conn_id, conn_type=conn.conn_type, host=conn.host, port=conn.port, login=conn.login,
        password=conn.password, schema=conn.schema, extra=conn.extra_dejson,
    )


def postgres_params(conn: ConnectionFields) -> dict[str, Any]:
    """psycopg2.connect keyword arguments; extras such as sslmode pass through."""
    if not conn.host:
        raise InputError(f"postgres connection {conn.conn_id!r} has no host")
    params: dict[str, Any] = {"host": conn.host, "dbname": conn.schema or "postgres"}
    if conn.port:
        params["port"] = conn.port
    if conn.login:
        params["user"] = conn.login
    if conn.password:
        params["password"] = conn.password
    params.update({k: v for k, v in conn.extra.items() if k in _LIBPQ_EXTRAS})
    return params


_LIBPQ_EXTRAS = {
    "sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name", "options",
    "target_session_attrs", "keepalives", "keepalives_idle",
}


def kafka_config(conn: ConnectionFields) -> dict[str, Any]:
    """librdkafka settings from the connection extra (as the Airflow Kafka provider stores them)."""
    config = dict(conn.extra)
    if not config.get("bootstrap.servers"):
        if conn.host:
            config["bootstrap.servers"] = f"{conn.host}:{conn.port or 9092}"
        else:
            raise InputError(
                f"kafka connection {conn.conn_id!r} needs 'bootstrap.servers' in its extra (librdkafka settings)"
            )
    if conn.login and "sasl.username" not in config:
        config["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in config:
        config["sasl.password"] = conn.password
    return config


# The Schema Registry client's settings a connection's extra may give (confluent-kafka's names).
_REGISTRY_EXTRAS = {
    "url", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "timeout",
    "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity", "proxy",
    "bearer.auth.credentials.source", "bearer.auth.token", "bearer.auth.logical.cluster",
    "bearer.auth.identity.pool.id", "basic.auth.user.info",
}
# A registry that does not answer fails a task within seconds (the client's defaults retry for longer).
_REGISTRY_DEFAULTS = {"timeout": 10, "max.retries": 2, "retries.wait.ms": 500}


def schema_registry_config(conn: ConnectionFields) -> dict[str, Any]:
    """confluent-kafka's SchemaRegistryClient settings: the URL from the host (`https://registry:8081`,
    or host, port and `schema` as the scheme, as Airflow's HTTP connections keep them) or the extra's
    `url`; login and password as basic auth; the extra's client settings (TLS files, a bearer token)."""
    unknown = sorted(set(conn.extra) - _REGISTRY_EXTRAS)
    if unknown:
        raise InputError(f"schema registry connection {conn.conn_id!r}: unknown extra setting(s) {unknown}; "
                         f"known: {sorted(_REGISTRY_EXTRAS)}")
    config: dict[str, Any] = {**_REGISTRY_DEFAULTS, **conn.extra}
    if "url" not in config:
        if not conn.host:
            raise InputError(f"schema registry connection {conn.conn_id!r} has no host (or `url` in its extra)")
        host = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"
        config["url"] = f"{host}:{conn.port}" if conn.port else host
    if conn.login and "basic.auth.user.info" not in config:
        config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
    if "bearer.auth.token" in config:
        config.setdefault("bearer.auth.credentials.source", "STATIC_TOKEN")
    return config
