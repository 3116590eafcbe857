"""A table's changelog: the keys whose row changed, captured by Postgres itself, for the Kafka sink.

A Kafka sink with `changelog_of: <table>` publishes, in each batch's commit, the current row of every key
of the table that changed since the last publish (or a tombstone for a key that is gone), so a compacted
topic converges to the table. Which keys changed is not computed by the sinks: three statement-level
triggers on the table (insert, update, delete) add the keys of the rows each statement changed to an
outbox, `kafka_batch.<table>__changed`. They see every path alike (a batch's apply, a replay's or a
rewind's removal, an operator's own UPDATE), and the outbox rows are written, read and deleted inside the
same Postgres transactions as the changes, so a change is published exactly when it commits: a rewind's
changes (committed without a batch) wait in the outbox for the next batch's publish.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg2 import sql

from kafka_batch.errors import InputError
from kafka_batch.sinks.base import names, same

SCHEMA = "kafka_batch"
# information_schema's name of a column type, where it differs from the definition's (sinks.base.COLUMN_TYPES).
_DEFINITION_TYPES = {"timestamp with time zone": "timestamptz"}
_EVENTS = {"insert": "NEW", "update": "NEW", "delete": "OLD"}  # the transition table that holds the keys


def outbox_name(table: str) -> str:
    return f"{table}__changed"


def _trigger(event: str) -> str:
    return f"kafka_batch_changelog_{event}"


def primary_key(cur, table: str) -> list[str]:
    """The columns of public.<table>'s primary key, in order (what a changelog message is keyed by)."""
    cur.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
        (sql.Identifier("public", table).as_string(cur),),
    )
    return [name for (name,) in cur.fetchall()]


def installed(cur, table: str) -> bool:
    cur.execute("SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname = %s)",
                (sql.Identifier("public", table).as_string(cur), _trigger("insert")))
    return cur.fetchone()[0]


def install(cur, pipeline_name: str, table: str) -> None:
    """Capture the table's changed keys from now on. A table with rows already has all of them in the
    outbox at once: the first publish sends the whole table, so the topic starts equal to it."""
    if installed(cur, table):
        return
    keys = primary_key(cur, table)
    if not keys:
        raise InputError(f"pipeline {pipeline_name!r}: the Kafka sink's changelog_of names table {table!r}, which has"
                         " no primary key; a changelog needs the keyed table of an aggregate or upsert sink")
    target, outbox = sql.Identifier("public", table), sql.Identifier(SCHEMA, outbox_name(table))
    cur.execute(sql.SQL("CREATE TABLE {outbox} AS SELECT {keys} FROM {target}; ALTER TABLE {outbox} ADD PRIMARY KEY"
                        " ({keys})").format(outbox=outbox, keys=names(keys), target=target))
    cur.execute(sql.SQL(
        "CREATE FUNCTION {outbox}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO {outbox} SELECT DISTINCT {keys} FROM changed ON CONFLICT DO NOTHING; RETURN NULL; END $$"
    ).format(outbox=outbox, keys=names(keys)))
    for event, side in _EVENTS.items():
        cur.execute(sql.SQL("CREATE TRIGGER {name} AFTER {event} ON {target} REFERENCING {side} TABLE AS changed"
                            " FOR EACH STATEMENT EXECUTE FUNCTION {outbox}()").format(
            name=sql.Identifier(_trigger(event)), event=sql.SQL(event.upper()), target=target, side=sql.SQL(side),
            outbox=outbox))


def uninstall(cur, tables: Iterable[str]) -> None:
    """Stop capturing changes of these tables (the definition no longer publishes them); DDL only where
    there is something to drop, so a pipeline's start never waits behind a running commit for nothing."""
    for table in tables:
        if installed(cur, table):
            target = sql.Identifier("public", table)
            for event in _EVENTS:
                cur.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(_trigger(event)), target))
            outbox = sql.Identifier(SCHEMA, outbox_name(table))
            cur.execute(sql.SQL("DROP FUNCTION {}(); DROP TABLE {}").format(outbox, outbox))


def columns(cur, table: str) -> list[tuple[str, str]]:
    """public.<table>'s columns as (name, column type as a definition gives it), in order."""
    cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'public'"
                " AND table_name = %s ORDER BY ordinal_position", (table,))
    return [(name, _DEFINITION_TYPES.get(kind, kind)) for name, kind in cur.fetchall()]


def take(cur, table: str) -> list[tuple[str, dict | None]]:
    """Inside the commit transaction: every changed key's message, (key as JSON text, the row as a dict of
    its columns, or None for a key no longer in the table: a tombstone), in key order; the outbox is
    emptied (by this same transaction, so only if the publish commits with it). Times are rendered in
    UTC, so a key's bytes never depend on the session's time zone (compaction needs equal keys to be
    equal bytes)."""
    keys = primary_key(cur, table)
    target, outbox = sql.Identifier("public", table), sql.Identifier(SCHEMA, outbox_name(table))
    cur.execute("SET LOCAL TimeZone = 'UTC'")
    cur.execute(sql.SQL(
        "WITH taken AS (DELETE FROM {outbox} RETURNING *)"
        " SELECT json_build_object({pairs})::text, t.{first} IS NOT NULL, t.*"
        " FROM taken c LEFT JOIN {target} t ON {match} ORDER BY {ordered}").format(
        outbox=outbox, target=target, first=sql.Identifier(keys[0]), match=same(keys, "c", "t"),
        ordered=names(keys, "c"),
        pairs=sql.SQL(", ").join(sql.SQL("{}, {}").format(sql.Literal(k), sql.Identifier("c", k)) for k in keys)))
    names_ = [column.name for column in cur.description[2:]]
    return [(key, dict(zip(names_, row, strict=True)) if present else None) for key, present, *row in cur.fetchall()]
