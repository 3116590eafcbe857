"""The Kafka sink's changelog shape: a table's changed keys published so that a compacted topic equals the
table, through batches, a Postgres commit that fails after the Kafka publish, a replay with a changed
definition, rewinds and deletes.

Ground truth is independent of the project's code: the input topic read by a plain consumer and totalled
(or compacted) here, and the output topic read by a plain read_committed consumer and compacted here (the
last message per key; a tombstone removes the key), which is what Kafka's compaction converges to.
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    COMPACTED,
    _committed_messages,
    _partitions,
    compact,
    create_topic,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    positions,
    query,
    run_cli,
    table_contents,
    update_pipeline,
)
from tests.integration.test_end_to_end import _transactional_page_views
from tests.integration.test_kafka_sink import fail_commit_after_publish
from tests.integration.test_upsert import compacted, customer, produce, table, upsert_pipeline

pytestmark = pytest.mark.integration


def _compacted_output(topic: str) -> tuple[dict[str, dict], list]:
    """key text -> its last value as JSON (tombstones remove the key), and every message's (key, value)."""
    latest, messages = {}, []
    for message in _committed_messages(topic, _partitions(topic)):
        key, value = message.key().decode(), message.value()
        messages.append((key, value))
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = json.loads(value)
    return latest, messages


def _totals(topic: str) -> dict:
    """(page, minute) -> (views, total duration) as the compacted output topic holds them."""
    latest, _ = _compacted_output(topic)
    found = {}
    for key, row in latest.items():
        page, minute = json.loads(key)["page"], datetime.fromisoformat(json.loads(key)["minute"])
        assert (row["page"], datetime.fromisoformat(row["minute"])) == (page, minute)  # the value is the key's row
        found[(page, minute)] = (row["views"], row["total_duration_ms"])
    return found


def _run_until_caught_up(name: str, topic: str) -> None:
    for _ in range(6):
        run_cli("run", "--pipeline", name)
        if positions(name) == {(topic, p): o for p, o in _ends(topic).items()}:
            return
    raise AssertionError(f"{name} did not catch up: {positions(name)}")


def _ends(topic: str) -> dict[int, int]:
    """Each partition's high watermark (past any transaction's marker): a caught-up pipeline's positions."""
    consumer = Consumer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "group.id": "ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in _partitions(topic)}
    finally:
        consumer.close()


def test_a_compacted_topic_equals_the_aggregate_table_through_replays_rewinds_and_faults(services):
    pipeline = new_pipeline("changelog", limits={"max_records_per_batch": 150})
    name, topic, minutes = pipeline.name, pipeline.topics[0], f"{pipeline.name}_minutes"
    hour = 3_600_000
    start = (int(time.time() * 1000) // hour - 3) * hour  # recent: retention keeps it
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=91, start_ms=start, spacing_ms=1000)
    _run_until_caught_up(name, topic)  # batches before the topic is published: the first publish sends them too

    output = f"{name}_out"
    create_topic(output, 2)
    aggregate = pipeline.definition["sinks"]["aggregate"]
    update_pipeline(name, sinks={"aggregate": aggregate, "kafka": {"topic": output, "changelog_of": minutes}})
    sample_data.produce_page_views(kafka_config(), topic, 40, seed=93, start_ms=start + hour)  # other keys
    _run_until_caught_up(name, topic)
    truth = ground_truth(topic)
    assert _totals(output) == table_contents(pipeline) == truth
    _, messages = _compacted_output(output)
    assert len(messages) == len({key for key, _ in messages}) == len(truth)  # one message per changed key so far

    # A batch published to Kafka whose Postgres commit fails: a reset must not supersede it (a new batch
    # would publish its records again); the next run completes it, and the topic still equals the table.
    sample_data.produce_page_views(kafka_config(), topic, 60, seed=92, start_ms=start + 2 * hour)
    fail_commit_after_publish(name)
    refused = run_cli("reset", "--pipeline", name, "--topic", topic, "--partitions", "1", "--to-offset", "0",
                      "--reason", "test", "--execute", check=False)
    assert refused.returncode != 0 and "is published to topic" in refused.stderr, refused.stderr
    assert "not yet committed in Postgres" in refused.stderr
    _run_until_caught_up(name, topic)
    truth = ground_truth(topic)
    assert _totals(output) == table_contents(pipeline) == truth

    # A replay of partition 0 with a changed measure publishes the corrected totals of the keys it changed.
    doubled = {**aggregate, "measures": {**aggregate["measures"],
                                         "total_duration_ms": {"expr": "duration_ms * 2", "type": "bigint"}}}
    update_pipeline(name, sinks={"aggregate": doubled, "kafka": {"topic": output, "changelog_of": minutes}})
    run_cli("replay", "--pipeline", name, "--topic", topic, "--partitions", "0", "--from", "0",
            "--until", str(positions(name)[(topic, 0)]), "--reason", "doubled durations")
    truth = merged(ground_truth(topic, select=lambda p, _: p == 0, duration_factor=2),
                   ground_truth(topic, select=lambda p, _: p != 0))
    assert _totals(output) == table_contents(pipeline) == truth

    # A rewind of partition 1 to its start: the keys it changed wait in the outbox for the next batch,
    # which reads the partition again (with the doubled measure) and publishes them.
    run_cli("reset", "--pipeline", name, "--topic", topic, "--partitions", "1", "--to-offset", "0",
            "--reason", "test", "--execute")
    assert query(f"SELECT count(*) > 0 FROM kafka_batch.{minutes}__changed") == [(True,)]
    _run_until_caught_up(name, topic)
    truth = merged(ground_truth(topic, select=lambda p, _: p in (0, 1), duration_factor=2),
                   ground_truth(topic, select=lambda p, _: p == 2))
    assert _totals(output) == table_contents(pipeline) == truth
    assert query(f"SELECT count(*) FROM kafka_batch.{minutes}__changed") == [(0,)]

    # Input from a transactional id that aborts a transaction and commits later ones, as exactly-once
    # producers write: the aborted records count nowhere, the later ones reach the table and the topic.
    before = positions(name)
    _transactional_page_views(topic, transactions=8, size=20, seed=97)
    _run_until_caught_up(name, topic)
    truth = merged(ground_truth(topic, select=lambda p, o: p in (0, 1) or o >= before[(topic, p)], duration_factor=2),
                   ground_truth(topic, select=lambda p, o: p == 2 and o < before[(topic, p)]))
    assert _totals(output) == table_contents(pipeline) == truth

    # Without the changelog the capture goes: no triggers, no outbox.
    update_pipeline(name, sinks={"aggregate": doubled})
    run_cli("run", "--pipeline", name)
    assert query("SELECT to_regclass(%s) IS NULL, count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s)",
                 f"kafka_batch.{minutes}__changed", f"public.{minutes}") == [(True, 0)]


def test_an_upsert_changelog_publishes_each_keys_latest_row_and_tombstones_for_deletes(services):
    pipeline = upsert_pipeline("changelogu", partitions=2, limits={"max_records_per_batch": 25})
    name, topic = pipeline.name, pipeline.topics[0]
    output = f"{name}_out"
    create_topic(output, 3, COMPACTED)
    update_pipeline(name, sinks={**pipeline.definition["sinks"], "kafka": {"topic": output, "changelog_of": name}})
    keys = [f"k{n}" for n in range(12)]
    produce(topic, [(n % 2, k, customer(k, f"{k}-v{v}", 10 * n + v)) for v in range(3) for n, k in enumerate(keys)])
    produce(topic, [(1, "k1", None), (0, "k2", None), (1, "k3", customer("k3", "k3-back", 99)), (1, "k5", None),
                    (0, "k4", b"not json")])
    for _ in range(4):
        run_cli("run", "--pipeline", name)

    def published() -> dict:
        latest, _ = _compacted_output(output)
        return {json.loads(k)["customer_id"]: ((v["name"], v["balance"]), (v["kafka_partition"], v["kafka_offset"]))
                for k, v in latest.items()}

    truth = compacted(topic)
    assert published() == table(pipeline) == truth
    assert {"k1", "k2", "k5"}.isdisjoint(truth) and truth["k3"][0] == ("k3-back", 99)
    _, messages = _compacted_output(output)
    tombstones = {json.loads(k)["customer_id"] for k, v in messages if v is None}
    assert tombstones == {"k1", "k2", "k5"}  # the deleted keys had rows published in earlier batches

    # A rewind of partition 1 and the rerun: the topic follows the table back to the same state.
    run_cli("reset", "--pipeline", name, "--topic", topic, "--partitions", "1", "--to-offset", "10", "--reason", "test",
            "--execute")
    _run_until_caught_up(name, topic)
    assert published() == table(pipeline) == compacted(topic)

    # Kafka's log cleaner compacts the topic: what it leaves is still the table.
    _, before = _compacted_output(output)
    compact(output)
    _, after = _compacted_output(output)
    assert len(after) < len(before)  # it removed superseded messages
    assert published() == table(pipeline) == compacted(topic)


@pytest.mark.parametrize("value_format", ["avro", "protobuf"])
def test_a_changelog_in_the_registrys_formats_read_back_by_confluents_deserializers_equals_the_table(
        services, value_format):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.integration.test_avro import registry_url
    from tests.integration.test_protobuf import message_class

    pipeline = new_pipeline("changelogf")
    name, topic, minutes = pipeline.name, pipeline.topics[0], f"{pipeline.name}_minutes"
    output = f"{name}_out"
    create_topic(output, 2)
    update_pipeline(name, sinks={"aggregate": pipeline.definition["sinks"]["aggregate"], "kafka": {
        "topic": output, "changelog_of": minutes, "value_format": value_format}})
    sample_data.produce_page_views(kafka_config(), topic, 120, seed=94)
    run_cli("run", "--pipeline", name)
    run_cli("reset", "--pipeline", name, "--topic", topic, "--partitions", "2", "--to-offset", "0", "--reason", "test",
            "--execute")
    sample_data.produce_page_views(kafka_config(), topic, 30, seed=95)
    _run_until_caught_up(name, topic)

    if value_format == "avro":
        avro = AvroDeserializer(SchemaRegistryClient({"url": registry_url()}))

        def totals(value: bytes) -> tuple[int, int]:
            row = avro(value, SerializationContext(output, MessageField.VALUE))
            return row["views"], row["total_duration_ms"]
    else:  # the table's columns in order, as kafka_batch.formats.writing documents the mapping; protoc here
        types = {"text": "optional string", "bigint": "optional int64",
                 "timestamp with time zone": "google.protobuf.Timestamp"}
        fields = " ".join(f"{types[kind]} {column} = {number};" for number, (column, kind) in enumerate(query(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'public'"
            " AND table_name = %s ORDER BY ordinal_position", minutes), 1))
        schema = ('syntax = "proto3";\npackage kafka_batch;\nimport "google/protobuf/timestamp.proto";\n'
                  f"message {output} {{ {fields} }}\n")
        protobuf = ProtobufDeserializer(message_class(schema, f"kafka_batch.{output}"), {"use.deprecated.format": False})

        def totals(value: bytes) -> tuple[int, int]:
            row = protobuf(value, SerializationContext(output, MessageField.VALUE))
            return row.views, row.total_duration_ms
    latest = {}
    for message in _committed_messages(output, _partitions(output)):
        key = json.loads(message.key())
        latest[(key["page"], datetime.fromisoformat(key["minute"]))] = (
            None if message.value() is None else totals(message.value()))
    assert {k: v for k, v in latest.items() if v is not None} == table_contents(pipeline) == ground_truth(topic)
