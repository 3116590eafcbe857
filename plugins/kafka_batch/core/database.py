"""The Postgres session every part of the core uses, and the schema's migrations.

Each session gets the settings the guarantee relies on (SESSION_SETTINGS) rather than assuming the
server's defaults; a refused or unreachable server is one clear error. Migrations are the numbered
files of sql/, each applied once under an advisory lock, so any number of processes may start at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2

from kafka_batch.errors import InputError, ServiceError, StateError


def sql_dir() -> Path:
    """The migrations: the package's sql/ (a link to the top-level sql/ in a checkout, files in a wheel)."""
    return Path(os.environ.get("KAFKA_BATCH_SQL_DIR", Path(__file__).resolve().parents[1] / "sql"))


# What the guarantee needs from every session, set by the project rather than assumed. A dead job must
# not hold row locks, and nothing waits forever; the connection's `options` extra may override these.
SESSION_SETTINGS = {
    "synchronous_commit": "on",
    "default_transaction_isolation": "read committed",  # the commit relies on row locks and compare-and-set
    "lock_timeout": "60s",
    "idle_in_transaction_session_timeout": "10min",
    "statement_timeout": "30min",
}
# The oldest server the commit's statements run on (MERGE came in PostgreSQL 15).
MIN_SERVER_VERSION = 150000


def connect(params: dict) -> psycopg2.extensions.connection:
    """A session with SESSION_SETTINGS; a refused, unreachable or too old server is one clear error."""
    ours = " ".join(f"-c {k}={v.replace(' ', chr(92) + ' ')}" for k, v in SESSION_SETTINGS.items())
    params = {**params, "options": f"{ours} {params.get('options', '')}".strip()}
    where = f"Postgres at {params.get('host')}:{params.get('port', 5432)} (database {params.get('dbname')})"
    try:
        conn = psycopg2.connect(**params)
    except psycopg2.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if any(word in reason for word in ("authentication failed", "does not exist", "no password", "role")):
            raise InputError(f"{where} refused the connection: {reason}") from None
        raise ServiceError(f"{where} did not answer: {reason}") from None
    if conn.server_version < MIN_SERVER_VERSION:
        version = conn.server_version
        conn.close()
        raise InputError(f"{where} is PostgreSQL {version // 10000}.{version % 10000}; kafka-batch needs"
                         f" {MIN_SERVER_VERSION // 10000} or later")
    return conn


@contextmanager
def transaction(conn) -> Iterator:
    """One transaction: commit on success, roll back on any error."""
    with conn:
        with conn.cursor() as cur:
            yield cur


def pending_migrations(conn) -> bool:
    """Whether any sql/NNN_*.sql file is not applied yet: a read, no DDL and no lock."""
    files = {path.name for path in sql_dir().glob("[0-9][0-9][0-9]_*.sql")}
    with transaction(conn) as cur:
        cur.execute("SELECT to_regclass('public.kafka_batch_migrations') IS NOT NULL")
        if not cur.fetchone()[0]:
            return True
        cur.execute("SELECT version FROM public.kafka_batch_migrations")
        return bool(files - {row[0] for row in cur.fetchall()})


def apply_migrations(conn) -> list[str]:
    """Apply sql/NNN_*.sql files not applied yet, each once, under an advisory lock, all in one transaction:
    an upgrade applies every pending migration or none. One that Postgres refuses is a StateError (a
    retry meets the same refusal) naming the file and Postgres' reason; the schema stays as it was."""
    if not pending_migrations(conn):
        return []
    applied: list[str] = []
    with transaction(conn) as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('kafka_batch.migrations'))")
        cur.execute(
            "CREATE TABLE IF NOT EXISTS public.kafka_batch_migrations"
            " (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur.execute("SELECT version FROM public.kafka_batch_migrations")
        done = {row[0] for row in cur.fetchall()}
        pending = [path for path in sorted(sql_dir().glob("[0-9][0-9][0-9]_*.sql")) if path.name not in done]
        for path in pending:
            try:
                cur.execute(path.read_text())
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                raise  # the connection, not the migration: a service error, retried
            except psycopg2.Error as exc:
                reason = exc.diag.message_primary or str(exc).strip().splitlines()[0]
                raise StateError(
                    f"migration {path.name} cannot be applied to {conn.info.dbname}: {reason}; none of the"
                    f" {len(pending)} pending migrations ({pending[0].name} to {pending[-1].name}) was applied,"
                    " the schema is as it was") from None
            cur.execute("INSERT INTO public.kafka_batch_migrations (version) VALUES (%s)", (path.name,))
            applied.append(path.name)
    return applied
