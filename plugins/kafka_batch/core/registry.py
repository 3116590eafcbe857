"""A pipeline's row in `kafka_batch.pipelines`, its sinks' tables, and the lock that serializes it.

Every change to a pipeline's progress (plan, commit, reset) first locks its row FOR UPDATE, so those
changes run one at a time per pipeline whatever Airflow runs concurrently.
"""

from __future__ import annotations

from kafka_batch.config import Pipeline
from kafka_batch.core.database import transaction
from kafka_batch.errors import StateError
from kafka_batch.sinks import changelog


def ensure_pipeline(conn, pipeline: Pipeline) -> None:
    """Register the pipeline and create its sinks' tables (each sink refuses tables that differ).

    Tables that already exist are only checked: no DDL, so this never waits behind a running commit.
    """
    with transaction(conn) as cur:
        cur.execute("SELECT 1 FROM kafka_batch.pipelines WHERE name = %s", (pipeline.name,))
        if cur.fetchone() is None:
            cur.execute("INSERT INTO kafka_batch.pipelines (name) VALUES (%s) ON CONFLICT DO NOTHING", (pipeline.name,))
        for sink in sorted(pipeline.sinks, key=lambda s: s.publishes):  # a changelog needs its table first
            sink.create(cur, pipeline.name)
        published = {t for sink in pipeline.sinks for t in sink.publishes_tables}
        changelog.uninstall(cur, [t for t in pipeline.tables if t not in published])


def lock_pipeline(cur, pipeline_name: str) -> None:
    cur.execute("SELECT name FROM kafka_batch.pipelines WHERE name = %s FOR UPDATE", (pipeline_name,))
    if cur.fetchone() is None:
        raise StateError(f"pipeline {pipeline_name!r} is not registered in kafka_batch.pipelines")
