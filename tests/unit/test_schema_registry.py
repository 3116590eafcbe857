"""The local Schema Registry keeps compatibility as Confluent's does, seen through Confluent's own client and
serializer: a new Avro schema is checked against the subject's earlier ones under the subject's level, or
the global one (Apache Avro's checker decides), a refusal is 409 with the rule in its message and nothing
registered; levels and modes are kept per subject; deletes hide versions whose numbers are not reused."""

from __future__ import annotations

import json
import threading

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_batch_dev import schema_registry


def record(*fields: dict) -> Schema:
    return Schema(json.dumps({"type": "record", "name": "view", "fields": list(fields)}), "AVRO")


PAGE = {"name": "page", "type": "string"}
COUNTRY = {"name": "country", "type": "string", "default": "unknown"}  # added with a default: backward compatible
COUNTRY_REQUIRED = {"name": "country", "type": "string"}  # added without one: old data cannot be read
MS_LONG, MS_STRING = {"name": "ms", "type": "long", "default": 0}, {"name": "ms", "type": "string", "default": ""}


@pytest.fixture
def client(tmp_path):
    server = schema_registry.serve(0, tmp_path)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SchemaRegistryClient({"url": f"http://127.0.0.1:{server.server_address[1]}"})
    server.shutdown()
    server.server_close()


def refused(call) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as raised:
        call()
    return raised.value


def test_backward_by_default_a_compatible_schema_is_registered_an_incompatible_one_refused_with_409(client):
    assert client.get_compatibility() == "BACKWARD"
    assert client.register_schema("views-value", record(PAGE)) == 1
    assert client.register_schema("views-value", record(PAGE, COUNTRY)) == 2
    error = refused(lambda: client.register_schema("views-value", record(PAGE, COUNTRY, COUNTRY_REQUIRED | {"name": "city"})))
    assert (error.http_status_code, error.error_code) == (409, 409)
    assert 'incompatible with an earlier schema for subject "views-value"' in error.error_message
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in error.error_message and "compatibility: 'BACKWARD'" in error.error_message
    assert client.get_versions("views-value") == [1, 2]  # nothing registered
    # The same schema again is its existing version, not a new one.
    assert client.register_schema("views-value", record(PAGE)) == 1 and client.get_versions("views-value") == [1, 2]


def test_a_producers_serializer_is_refused_an_incompatible_schema_and_produces_nothing(client):
    context = SerializationContext("orders", MessageField.VALUE)
    AvroSerializer(client, record(PAGE, MS_LONG).schema_str)({"page": "/", "ms": 1}, context)
    serialize = AvroSerializer(client, record(PAGE, MS_STRING).schema_str)  # a long read as a string: no
    error = refused(lambda: serialize({"page": "/", "ms": "1"}, context))
    assert error.http_status_code == 409 and "compatibility: 'BACKWARD'" in error.error_message


@pytest.mark.parametrize(("level", "accepted"), [
    ("BACKWARD", False), ("FORWARD", True), ("FULL", False), ("NONE", True),
])
def test_each_level_decides_as_avros_rules_say(client, level, accepted):
    # A field added without a default: new readers cannot read old data (backward), old readers can
    # read new data (forward: they ignore the field).
    client.register_schema("s-value", record(PAGE))
    assert client.set_compatibility("s-value", level) == {"compatibility": level}
    assert client.get_compatibility("s-value") == level and client.get_compatibility() == "BACKWARD"
    assert client.test_compatibility("s-value", record(PAGE, COUNTRY_REQUIRED)) is accepted
    if accepted:
        assert client.register_schema("s-value", record(PAGE, COUNTRY_REQUIRED)) == 2
    else:
        assert refused(lambda: client.register_schema("s-value", record(PAGE, COUNTRY_REQUIRED))).http_status_code == 409


def test_transitive_levels_check_every_earlier_version_not_only_the_latest(client):
    ms_int = {"name": "ms", "type": "int", "default": 0}
    client.register_schema("t-value", record(PAGE, MS_STRING))
    client.register_schema("t-value", record(PAGE))  # the field removed: backward compatible
    # Back as a number: readable against version 2 (the field defaults), not against version 1's strings.
    client.set_compatibility("t-value", "BACKWARD_TRANSITIVE")
    client.set_compatibility(level="NONE")  # the global level does not matter: the subject's wins
    assert "oldSchemaVersion: 1" in refused(lambda: client.register_schema("t-value", record(PAGE, ms_int))).error_message
    client.delete_config("t-value")  # back to the global level
    client.set_compatibility("t-value", "BACKWARD")
    assert client.register_schema("t-value", record(PAGE, ms_int)) == 3


def test_a_level_or_mode_that_does_not_exist_is_refused_with_confluents_codes(client):
    assert refused(lambda: client.set_compatibility(level="SIDEWAYS")).error_code == 42203
    client.register_schema("m-value", record(PAGE))
    client.update_mode("m-value", "READONLY")
    error = refused(lambda: client.register_schema("m-value", record(PAGE, COUNTRY)))
    assert (error.http_status_code, error.error_code) == (422, 42205)
    assert client.get_mode("m-value") == "READONLY" and client.get_global_mode() == "READWRITE"


def test_deletes_hide_versions_keep_ids_readable_and_never_reuse_a_number(client):
    first = client.register_schema("d-value", record(PAGE))
    client.register_schema("d-value", record(PAGE, COUNTRY))
    assert client.delete_version("d-value", 2) == 2
    assert client.get_versions("d-value") == [1]
    assert client.register_schema("d-value", record(PAGE, COUNTRY, {"name": "city", "type": "string", "default": ""})) == 3
    assert client.get_versions("d-value") == [1, 3]
    assert refused(lambda: client.delete_subject("d-value", permanent=True)).error_code == 40405  # soft first
    assert client.delete_subject("d-value") == [1, 3]
    assert "d-value" not in client.get_subjects()
    assert json.loads(client.get_schema(first).schema_str)["fields"] == [PAGE]  # ids stay readable
    assert client.delete_subject("d-value", permanent=True) == [1, 2, 3]  # the soft-deleted 2 too
    assert refused(lambda: client.get_versions("d-value")).error_code == 40401


def test_levels_modes_and_deletes_survive_a_restart(tmp_path):
    saved = schema_registry.Schemas(tmp_path / "schemas.json")
    saved.register("r-value", {"schema": record(PAGE).schema_str})
    saved.set_config("r-value", {"compatibility": "FULL"})
    saved.set_mode("r-value", {"mode": "READONLY"})
    saved.delete("r-value", "1", {})
    again = schema_registry.Schemas(tmp_path / "schemas.json")
    assert again.get_config("r-value", {}) == {"compatibilityLevel": "FULL"}
    assert again.get_mode("r-value") == {"mode": "READONLY"}
    assert again.subject_names({}) == [] and again.subject_names({"deleted": ["true"]}) == ["r-value"]
