"""Values written to Kafka in Avro, through the Schema Registry: what the Kafka sink publishes with
`value_format: avro`.

The schema is made from the output's columns (each nullable, a union with null whose default is null;
times as `timestamp-micros`, dates as `date`), named after the topic, and registered under the topic's
value subject (`<topic>-value`, the TopicNameStrategy every Confluent client expects); values are in the
Confluent wire format. The serializer is confluent-kafka's (it registers once per process and caches the
id). A subject whose registered schemas the new one is incompatible with is bad input (never retried).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_batch.errors import InputError
from kafka_batch.formats import registry

# The Avro type of each column type an output may have (kafka_batch.sinks.base.COLUMN_TYPES).
AVRO_TYPES: dict[str, Any] = {
    "text": "string", "bigint": "long", "integer": "int", "double precision": "double", "boolean": "boolean",
    "date": {"type": "int", "logicalType": "date"},
    "timestamptz": {"type": "long", "logicalType": "timestamp-micros"},
}


def avro_schema(topic: str, columns: Sequence[tuple[str, str]]) -> dict:
    """A record named after the topic with a nullable field per (name, column type)."""
    return {"type": "record", "name": re.sub(r"\W", "_", topic), "namespace": "kafka_batch",
            "fields": [{"name": name, "type": ["null", AVRO_TYPES[kind]], "default": None} for name, kind in columns]}


class AvroValues:
    """Encodes rows (dicts of the columns) as the topic's values, registering the schema on first use."""

    def __init__(self, registry_config: dict, topic: str, schema: dict):
        from confluent_kafka.schema_registry.avro import AvroSerializer

        self._config = registry_config
        self.subject = f"{topic}-value"
        self._serialize = AvroSerializer(registry.client(registry_config), json.dumps(schema),
                                         conf={"auto.register.schemas": True})
        self._context = SerializationContext(topic, MessageField.VALUE)

    def encode(self, row: dict | None) -> bytes | None:
        if row is None:
            return None
        try:
            return self._serialize(row, self._context)
        except SchemaRegistryError as exc:
            if exc.http_status_code in (409, 422):
                raise InputError(f"the schema registry refused the value schema for subject {self.subject!r}"
                                 f" (HTTP {exc.http_status_code}: {exc.error_message}): the output's columns changed"
                                 " incompatibly; change them back, or the subject's compatibility") from None
            raise registry.registry_error(self._config, exc) from None
        except (InputError, ValueError, TypeError):
            raise
        except Exception as exc:  # noqa: BLE001 - the client's transport errors (httpx) have no base of its own
            raise registry.no_answer(self._config, exc) from None
