"""Envelopes: a wrapper around a record's real fields, unwrapped after the value is decoded.

Decoding turns a value's bytes into a struct (JSON today; the schema comes from `value_schema`). An
envelope says where the pipeline's fields are in that struct and what else it carries, whatever the
decoding was, so every format composes with every envelope.

`debezium`, a change-data-capture event: the fields come from `after`, or from `before` for a delete
(`op = 'd'`), with or without the JSON converter's `{schema, payload}` wrapper; `op`, `ts_ms` and
`source` (a struct: `source.lsn`, `source.ts_ms`, ...) become columns a pipeline can use. Snapshot
reads (`op = 'r'`), creates and updates carry a row; a delete says its key is gone.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from kafka_batch.config import ENVELOPE_COLUMNS

# Debezium's source block: the fields its connectors document, with their types (a field another
# connector types otherwise is null, not an error: from_json keeps the rest of the record).
DEBEZIUM_SOURCE = {
    "version": "string", "connector": "string", "name": "string", "ts_ms": "long", "snapshot": "string",
    "db": "string", "sequence": "string", "schema": "string", "table": "string", "txId": "long", "lsn": "long",
    "xmin": "long", "file": "string", "pos": "long", "row": "int", "server_id": "long", "gtid": "string",
    "thread": "long", "change_lsn": "string", "commit_lsn": "string", "event_serial_no": "long",
    "collection": "string", "ord": "int",
}
ROW_CHANGES = ("c", "u", "r", "d")  # create, update, snapshot read, delete


def _struct(fields: dict[str, str]) -> str:
    return "struct<" + ", ".join(f"`{name}`: {ftype}" for name, ftype in fields.items()) + ">"


def value_schema(fields: dict[str, str], envelope: str | None) -> str:
    """What decoding must yield (a Spark DDL schema): the fields, or the envelope around them."""
    if envelope is None:
        return ", ".join(f"`{name}` {ftype}" for name, ftype in fields.items())
    event = {"before": _struct(fields), "after": _struct(fields), "op": "string", "ts_ms": "long",
             "source": _struct(DEBEZIUM_SOURCE)}
    return ", ".join([f"payload {_struct(event)}", *[f"`{name}` {ftype}" for name, ftype in event.items()]])


class Unwrapped:
    """Columns over a decoded value: the fields, the envelope's own columns, whether the record says its
    key is deleted, and why it is not a valid event (null when it is)."""

    def __init__(self, decoded: Column, envelope: str | None, members: tuple[str, ...] | None = None):
        """`members`: the decoded struct's fields when its schema is known (Avro: never the JSON
        converter's wrapper, and a field it lacks is null); None: the JSON shape of `value_schema`."""
        if envelope is None:
            self.row = decoded
            self.extra: list[Column] = []
            self.deleted = F.lit(False)
            self.problem = F.lit(None).cast("string")
            return
        names = ("before", "after", "op", "ts_ms", "source")
        if members is None:
            root = F.struct(*[decoded.getField(name).alias(name) for name in names])
            event = F.coalesce(decoded.getField("payload"), root)
        else:
            event = F.struct(*[(decoded.getField(name) if name in members else F.lit(None)).alias(name)
                               for name in names])
        op = event.getField("op")
        self.deleted = F.coalesce(op == F.lit("d"), F.lit(False))
        self.row = F.when(op == F.lit("d"), event.getField("before")).otherwise(event.getField("after"))
        self.extra = [event.getField(name).alias(name) for name in ENVELOPE_COLUMNS[envelope]]
        self.problem = (
            F.when(op.isNull(), F.lit("not a Debezium change event (no op)"))
            .when(~op.isin(*ROW_CHANGES), F.format_string("Debezium op '%s' is not a row change (c, u, r, d)", op))
            .when(self.row.isNull(), F.format_string("Debezium op '%s' without its %s row", op,
                                                     F.when(op == F.lit("d"), "before").otherwise("after")))
        )

    def field(self, name: str) -> Column:
        return self.row.getField(name)
