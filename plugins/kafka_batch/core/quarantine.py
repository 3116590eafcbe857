"""The quarantine: records a pipeline cannot process, kept with their reason in the batch's commit.

They leave it with their range (a replay or rewind retires the range, and its quarantined records go).
"""

from __future__ import annotations

import io
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def keep(cur, pipeline_name: str, batch_id: int, records: pa.Table) -> int:
    """Inside the commit: the batch's invalid records, with their reasons (COPY, not row by row)."""
    if records.num_rows == 0:
        return 0
    columns = ["range_id", "offset", "topic", "partition", "timestamp", "key", "value", "value_bytes", "reason"]
    cur.execute("CREATE TEMP TABLE quarantine_stage ON COMMIT DROP AS"
                " SELECT range_id, \"offset\", topic, partition, \"timestamp\", key, value, value_bytes, reason"
                " FROM kafka_batch.quarantine WITH NO DATA")
    buffer = io.BytesIO()
    for row in records.select(columns).to_pylist():  # bounded by max_invalid_ratio; bytea needs escaping
        buffer.write(("\t".join(_copy_text(row[c]) for c in columns) + "\n").encode())
    buffer.seek(0)
    cur.copy_expert("COPY quarantine_stage FROM STDIN", buffer)
    cur.execute(
        "INSERT INTO kafka_batch.quarantine (range_id, \"offset\", pipeline, batch_id, topic, partition,"
        " \"timestamp\", key, value, value_bytes, reason) SELECT range_id, \"offset\", %s, %s, topic, partition,"
        " \"timestamp\", key, value, value_bytes, reason FROM quarantine_stage",
        (pipeline_name, batch_id),
    )
    cur.execute("DROP TABLE quarantine_stage")
    return records.num_rows


def newest(cur, pipeline_name: str, limit: int) -> list[dict]:
    """The newest quarantined records of a pipeline (live ranges only: a replay or rewind removed the rest)."""
    cur.execute(
        "SELECT topic, partition, \"offset\", batch_id, \"timestamp\", value_bytes, reason,"
        " encode(substring(value from 1 for 60), 'escape') FROM kafka_batch.quarantine"
        " WHERE pipeline = %s ORDER BY batch_id DESC, topic, partition, \"offset\" LIMIT %s",
        (pipeline_name, limit),
    )
    names = ("topic", "partition", "offset", "batch_id", "timestamp", "value_bytes", "reason", "value_start")
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _copy_text(value) -> str:
    """A value in COPY's text format: \\N for null, bytea as hex, tabs and newlines escaped."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
