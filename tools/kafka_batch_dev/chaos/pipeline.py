"""The pipeline under test: every sink (aggregate, rows, upsert, and a Kafka sink) on a topic of its own."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_batch_dev.chaos.harness import kafka_bootstrap, pg_params
from kafka_batch_dev.chaos.truth import AVRO_SCHEMA, UPSERT_DELETE_AT_MOST


def create_pipeline(pipeline: str, encoding: str, partitions: int, pipelines_dir: Path,
                    on_data_loss: str | None = None) -> tuple[str, dict[str, str], Path]:
    """A pipeline with every sink (aggregate, rows, upsert, and kafka: rows for JSON values, the
    aggregate's changelog for Avro) on a new topic of JSON or Avro values, its tables created before the
    first fault: (topic, tables and the output topic, definition file)."""
    from kafka_batch.config import load_pipeline
    from kafka_batch.core import registry

    topic, tables = f"{pipeline}_topic", {"aggregate": f"{pipeline}_pages", "rows": f"{pipeline}_records",
                                          "upsert": f"{pipeline}_latest", "kafka": f"{pipeline}_out",
                                          "kafka_shape": "changelog" if encoding == "avro" else "rows"}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
    for name, config in ((topic, {}), (tables["kafka"], {"cleanup.policy": "compact"}
                                       if tables["kafka_shape"] == "changelog" else {})):
        admin.create_topics([NewTopic(name, partitions, config=config)])[name].result()
    definition = {
        "name": pipeline, "topics": [topic], "schedule": None,
        "record": ({"format": "avro", "schema": AVRO_SCHEMA} if encoding == "avro" else
                   {"fields": {"id": "string", "page": "string", "amount": "long"}}),
        "limits": {"max_invalid_ratio": 0.5},
        **({"on_data_loss": on_data_loss} if on_data_loss else {}),
        "read": {"fence_check_seconds": 1, "stall_timeout_seconds": 60},
        "sinks": {"aggregate": {"table": tables["aggregate"], "group_by": {"page": "page"},
                                "measures": {"n": "1", "amount": "amount"}},
                  "rows": {"table": tables["rows"], "columns": {"id": "id", "amount": {"expr": "amount",
                                                                                        "type": "bigint"}}},
                  "upsert": {"table": tables["upsert"], "key": {"bucket": "substr(id, 1, 2)"},
                             "columns": {"id": "id", "amount": {"expr": "amount", "type": "bigint"}},
                             "delete_when": f"amount <= {UPSERT_DELETE_AT_MOST}"},
                  "kafka": ({"topic": tables["kafka"], "changelog_of": tables["aggregate"]}
                            if tables["kafka_shape"] == "changelog" else
                            {"topic": tables["kafka"], "key": "id", "value": {"id": "id", "amount": "amount"}})},
    }
    path = pipelines_dir / f"{pipeline}.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    conn = psycopg2.connect(**pg_params())
    registry.ensure_pipeline(conn, load_pipeline(pipeline, pipelines_dir))
    conn.close()
    return topic, tables, path
