"""The ACLs a pipeline's Kafka users need (kafka.acls): what each pipeline shape asks for, and the forms an
operator applies them in. The broker's own verdict on them is tests/integration/test_kafka_security.py."""

from __future__ import annotations

import yaml

from kafka_batch.config import PROJECT_ROOT, parse_pipeline
from kafka_batch.kafka import acls
from kafka_batch.kafka.publish import transactional_id


def _pipeline(**changes):
    definition = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    definition.update(changes)
    return parse_pipeline(definition, source="test.yaml")


def _granted(grants) -> set[tuple]:
    return {(g.resource, g.name, op, g.prefixed, g.output) for g in grants for op in g.operations}


def test_a_reading_pipeline_needs_describe_and_read_on_its_topics_and_describe_on_the_readers_group():
    grants = acls.required(_pipeline(topics=["a", "b"]))

    assert _granted(grants) == {("topic", t, op, False, False) for t in "ab" for op in ("Describe", "Read")} | {
        ("group", "kafka-batch-range-reader", "Describe", False, False)}


def test_a_kafka_sink_adds_its_topic_transactional_id_and_publish_group_on_the_output_side():
    pipeline = _pipeline(sinks={"kafka": {"topic": "out", "key": "user_id", "value": {"page": "page"}}})
    tid = transactional_id(pipeline.name, "out")

    output = _granted(g for g in acls.required(pipeline) if g.output)

    assert output == {("topic", "out", op, False, True) for op in ("Describe", "Write", "DescribeConfigs", "Read")} | {
        ("transactional-id", tid, op, False, True) for op in ("Describe", "Write")} | {
        ("group", tid, op, False, True) for op in ("Describe", "Read")}


def test_a_prefix_pattern_is_one_prefixed_grant_and_any_other_pattern_the_topics_it_matches_now():
    prefixed = acls.required(_pipeline(topics={"pattern": r"orders\..*"}), matching=["orders.eu"])
    assert [(g.name, g.prefixed) for g in prefixed if g.resource == "topic"] == [("orders.", True)]

    other = acls.required(_pipeline(topics={"pattern": "(orders|refunds)-v2"}), matching=["refunds-v2", "orders-v2"])
    assert [(g.name, g.prefixed) for g in other if g.resource == "topic"] == [("orders-v2", False), ("refunds-v2", False)]


def test_the_grants_print_as_kafka_acls_commands_and_map_to_admin_api_bindings():
    from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

    grants = [acls.Grant("topic", "orders.", ("Describe", "Read"), "read", prefixed=True),
              acls.Grant("group", "g", ("DescribeConfigs",), "why")]

    [first, second] = acls.kafka_acls_commands(grants, "User:etl", "broker:9093")
    assert first == ("# read\nkafka-acls.sh --bootstrap-server broker:9093 --command-config '<admin.properties>' --add"
                     " --allow-principal User:etl --operation Describe --operation Read --topic orders."
                     " --resource-pattern-type prefixed")
    assert second.endswith("--operation DescribeConfigs --group g")
    bindings = acls.bindings(grants, "User:etl")
    assert [(b.restype, b.name, b.resource_pattern_type, b.operation) for b in bindings] == [
        (ResourceType.TOPIC, "orders.", ResourcePatternType.PREFIXED, AclOperation.DESCRIBE),
        (ResourceType.TOPIC, "orders.", ResourcePatternType.PREFIXED, AclOperation.READ),
        (ResourceType.GROUP, "g", ResourcePatternType.LITERAL, AclOperation.DESCRIBE_CONFIGS)]
