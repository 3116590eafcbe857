"""Values written to Kafka in Avro or Protobuf, through the Schema Registry: what the Kafka sink
publishes with `value_format: avro` or `protobuf`.

The schema is made from the output's columns, named after the topic, and registered under the topic's
value subject (`<topic>-value`, the TopicNameStrategy every Confluent client expects); values are in the
Confluent wire format. Avro: each field a union with null whose default is null; times
`timestamp-micros`, dates `date`. Protobuf (proto3, package `kafka_batch`): field numbers in column
order, each scalar `optional` (so a null is absent, not zero), times `google.protobuf.Timestamp`, dates
ISO 8601 strings. The serializers are confluent-kafka's (they register once per process and cache the
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
    return {"type": "record", "name": _message_name(topic), "namespace": "kafka_batch",
            "fields": [{"name": name, "type": ["null", AVRO_TYPES[kind]], "default": None} for name, kind in columns]}


def _message_name(topic: str) -> str:
    return re.sub(r"\W", "_", topic)


def protobuf_message(topic: str, columns: Sequence[tuple[str, str]]):
    """A proto3 message class named after the topic with a field per (name, column type)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass

    field_type = descriptor_pb2.FieldDescriptorProto
    scalars = {"text": field_type.TYPE_STRING, "bigint": field_type.TYPE_INT64, "integer": field_type.TYPE_INT32,
               "double precision": field_type.TYPE_DOUBLE, "boolean": field_type.TYPE_BOOL,
               "date": field_type.TYPE_STRING}
    file = descriptor_pb2.FileDescriptorProto(name=f"kafka_batch/{_message_name(topic)}.proto", package="kafka_batch",
                                              syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    message = file.message_type.add(name=_message_name(topic))
    for number, (name, kind) in enumerate(columns, 1):
        field = message.field.add(name=name, number=number, label=field_type.LABEL_OPTIONAL)
        if kind == "timestamptz":
            field.type, field.type_name = field_type.TYPE_MESSAGE, ".google.protobuf.Timestamp"
        else:  # proto3 `optional`: a synthetic oneof of its own
            field.type, field.proto3_optional, field.oneof_index = scalars[kind], True, len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{name}")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName(f"kafka_batch.{message.name}"))


class RegistryValues:
    """Encodes rows (dicts of the columns) as the topic's values in `value_format`, registering the
    schema on first use."""

    def __init__(self, registry_config: dict, topic: str, value_format: str, columns: Sequence[tuple[str, str]]):
        self._config = registry_config
        self.subject = f"{topic}-value"
        self._context = SerializationContext(topic, MessageField.VALUE)
        client = registry.client(registry_config)
        if value_format == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            self._message = lambda row: row
            self._serialize = AvroSerializer(client, json.dumps(avro_schema(topic, columns)),
                                             conf={"auto.register.schemas": True})
        else:
            from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

            message, kinds = protobuf_message(topic, columns), dict(columns)
            self._message = lambda row: _protobuf(message(), kinds, row)
            self._serialize = ProtobufSerializer(message, client, {"auto.register.schemas": True,
                                                                   "use.deprecated.format": False})

    def encode(self, row: dict | None) -> bytes | None:
        if row is None:
            return None
        try:
            return self._serialize(self._message(row), self._context)
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


def _protobuf(message, kinds: dict[str, str], row: dict):
    """The row's non-null columns set on the message (a null stays absent)."""
    for name, value in row.items():
        if value is None:
            continue
        if kinds[name] == "timestamptz":
            getattr(message, name).FromDatetime(value)
        else:
            setattr(message, name, value.isoformat() if kinds[name] == "date" else value)
    return message
