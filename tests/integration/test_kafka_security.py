"""Kafka's own security on the real listener: SASL_SSL with SCRAM-SHA-512 and KRaft's StandardAuthorizer
(one node as `kafka-batch local up --kafka-security sasl_ssl` starts it).

The pipeline logs in as a principal of its own that holds only the ACLs `kafka-batch acls` lists. The
broker refuses every request of a connection that did not authenticate, and every operation that no ACL
allows, so a batch that commits the topic's ground truth (read as the admin, independently) shows that the
planner, the Spark driver and every executor's reader logged in with the connection's credentials. Its
password is the planted one, so the session's final scan of every log covers it too.

A wrong password and a missing ACL, on the input topic and on the output topic, are each one line, exit 2,
and change nothing: no batch, no position, no row, no message.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from kafka_batch.kafka.publish import transactional_id
from kafka_batch_dev import sample_data
from tests.conftest import FAKE_PASSWORD
from tests.integration.helpers import (
    _committed_messages,
    ground_truth,
    new_pipeline,
    positions,
    query,
    rows_contents,
    rows_truth,
    run_cli,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration

ACL_HINT = "`kafka-batch acls --pipeline <name>` prints those a pipeline needs"


@pytest.fixture
def user(secured_kafka):
    """A SCRAM user of its own, with the planted password and no ACL yet; the environment's connections:
    `kafka_pipeline` logs in as it, `kafka_admin` as the cluster's admin."""
    name = f"etl-{uuid.uuid4().hex[:6]}"
    secured_kafka.add_user(name, FAKE_PASSWORD)
    return name, {"AIRFLOW_CONN_KAFKA_PIPELINE": secured_kafka.connection(name, FAKE_PASSWORD),
                  "AIRFLOW_CONN_KAFKA_ADMIN": secured_kafka.connection()}


def _pipeline(prefix: str, secured_kafka, partitions: int = 2, **overrides):
    pipeline = new_pipeline(prefix, partitions=0, connections={"kafka": "kafka_pipeline"}, **overrides)
    sample_data.ensure_topic(secured_kafka.admin, pipeline.topics[0], partitions)
    return pipeline


def _with_kafka_sink(pipeline, secured_kafka) -> tuple[object, str]:
    output = f"{pipeline.name}_out"
    sample_data.ensure_topic(secured_kafka.admin, output, 2)
    return update_pipeline(pipeline.name, sinks={**pipeline.definition["sinks"], "kafka": {
        "topic": output, "key": "user_id", "value": {"page": "page"}, "call_timeout_seconds": 30}}), output


def _refused_in_one_line(pipeline, env: dict[str, str]) -> str:
    """`kafka-batch run`'s one line, refused as bad input (exit 2: Airflow does not retry it)."""
    refused = run_cli("run", "--pipeline", pipeline.name, check=False, env=env)
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert not refused.stdout.strip(), refused.stdout
    return line


def _nothing_changed(pipeline, *outputs: str, secured_kafka) -> None:
    assert query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name) == [(0,)]
    assert positions(pipeline.name) == {}
    for output in outputs:
        assert not list(_committed_messages(output, [0, 1], secured_kafka.admin))


def test_the_pipelines_own_user_with_its_acls_reads_and_commits_exactly(secured_kafka, user):
    name, env = user
    pipeline = _pipeline("secured", secured_kafka, rows=True, spark_submit=True)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(secured_kafka.admin, topic, 400, seed=21)

    printed = run_cli("acls", "--pipeline", pipeline.name, env=env).stdout
    assert f"--allow-principal User:{name} --operation Describe --operation Read --topic {topic}" in printed
    applied = run_cli("acls", "--pipeline", pipeline.name, "--apply", "kafka_admin", env=env)
    assert applied.stdout.strip() == f"created 3 ACL(s) for User:{name} (input of pipeline {pipeline.name})"
    run_cli("run", "--pipeline", pipeline.name, env=env)

    messages = list(_committed_messages(topic, [0, 1], secured_kafka.admin))  # read as the admin, independently
    assert table_contents(pipeline) == ground_truth(topic, messages=messages)
    assert rows_contents(pipeline) == rows_truth(topic, messages=messages)
    assert positions(pipeline.name) == {(topic, 0): sum(m.partition() == 0 for m in messages),
                                        (topic, 1): sum(m.partition() == 1 for m in messages)}


def test_a_kafka_sink_publishes_exactly_with_only_its_acls(secured_kafka, user):
    name, env = user
    pipeline, output = _with_kafka_sink(_pipeline("secured_sink", secured_kafka), secured_kafka)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(secured_kafka.admin, topic, 300, seed=23)

    printed = run_cli("acls", "--pipeline", pipeline.name, env=env).stdout
    tid = transactional_id(pipeline.name, output)
    assert f"--operation Describe --operation Write --transactional-id {tid}" in printed
    assert f"--operation Describe --operation Read --group {tid}" in printed
    run_cli("acls", "--pipeline", pipeline.name, "--apply", "kafka_admin", env=env)
    run_cli("run", "--pipeline", pipeline.name, env=env)

    expected = Counter(f"{topic}:{m.partition()}:{m.offset()}"
                       for m in _committed_messages(topic, [0, 1], secured_kafka.admin))
    published = Counter(dict(m.headers())["kafka_batch.source"].decode()
                        for m in _committed_messages(output, [0, 1], secured_kafka.admin))
    assert len(expected) == 300 and published == expected


def test_a_wrong_password_is_refused_in_one_line_before_anything_changes(secured_kafka, user):
    name, _ = user
    pipeline = _pipeline("secured_wrong", secured_kafka, read={"kafka_timeout_seconds": 5})
    sample_data.produce_page_views(secured_kafka.admin, pipeline.topics[0], 50, seed=22)
    env = {"AIRFLOW_CONN_KAFKA_PIPELINE": secured_kafka.connection(name, "not-the-password"),
           "AIRFLOW_CONN_KAFKA_ADMIN": secured_kafka.connection()}
    run_cli("acls", "--pipeline", pipeline.name, "--apply", "kafka_admin", env=env)

    line = _refused_in_one_line(pipeline, env)

    assert line.startswith("kafka-batch: invalid input: Kafka refused the credentials of the connection: "), line
    assert "Authentication failed during authentication due to invalid credentials with SASL mechanism" in line
    assert "not-the-password" not in line
    _nothing_changed(pipeline, secured_kafka=secured_kafka)


def test_a_missing_read_acl_on_the_input_is_one_line_and_nothing_is_planned(secured_kafka, user):
    name, env = user
    pipeline = _pipeline("secured_noread", secured_kafka)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(secured_kafka.admin, topic, 50, seed=24)
    # Describe only: partitions and offsets are answered, the read would be refused.
    run_cli("acls", "--pipeline", pipeline.name, "--principal", f"User:{name}", "--apply", "kafka_admin", env=env)
    _revoke(secured_kafka, name, "topic", topic, "READ")

    line = _refused_in_one_line(pipeline, env)

    assert line == (f"kafka-batch: invalid input: Kafka's ACLs refuse the connection's user Read on topic {topic!r},"
                    f" needed to read the pipeline's input ({ACL_HINT})"), line
    _nothing_changed(pipeline, secured_kafka=secured_kafka)

    _grant(secured_kafka, name, "topic", topic, "READ")
    run_cli("run", "--pipeline", pipeline.name, env=env)
    assert table_contents(pipeline) == ground_truth(topic, config=secured_kafka.admin)


def test_no_acl_at_all_on_the_input_is_one_line(secured_kafka, user):
    _, env = user
    pipeline = _pipeline("secured_noacl", secured_kafka)

    line = _refused_in_one_line(pipeline, env)

    assert line.startswith(f"kafka-batch: invalid input: Kafka refused Describe on topic {pipeline.topics[0]!r}:"
                           " Broker: Topic authorization failed"), line
    _nothing_changed(pipeline, secured_kafka=secured_kafka)


def test_a_missing_write_acl_on_the_output_is_one_line_and_nothing_is_written(secured_kafka, user):
    name, env = user
    pipeline, output = _with_kafka_sink(_pipeline("secured_nowrite", secured_kafka), secured_kafka)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(secured_kafka.admin, topic, 120, seed=25)
    run_cli("acls", "--pipeline", pipeline.name, "--apply", "kafka_admin", env=env)
    _revoke(secured_kafka, name, "topic", output, "WRITE")

    line = _refused_in_one_line(pipeline, env)

    assert line == (f"kafka-batch: invalid input: Kafka's ACLs refuse the connection's user Write on topic"
                    f" {output!r}, needed to publish the pipeline's batches ({ACL_HINT})"), line
    _nothing_changed(pipeline, output, secured_kafka=secured_kafka)  # its table not even made

    _grant(secured_kafka, name, "topic", output, "WRITE")
    run_cli("run", "--pipeline", pipeline.name, env=env)
    assert len(list(_committed_messages(output, [0, 1], secured_kafka.admin))) == 120
    assert table_contents(pipeline) == ground_truth(topic, config=secured_kafka.admin)


def _acl(name: str, resource: str, resource_name: str, operation: str, kind: str = "AclBinding"):
    """One ALLOW ACL of `name` (or, with kind AclBindingFilter, the filter that matches just it)."""
    from confluent_kafka import admin

    return getattr(admin, kind)(admin.ResourceType[resource.upper()], resource_name, admin.ResourcePatternType.LITERAL,
                                f"User:{name}", "*", admin.AclOperation[operation], admin.AclPermissionType.ALLOW)


def _grant(secured_kafka, name: str, resource: str, resource_name: str, operation: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(secured_kafka.admin)
    for future in admin.create_acls([_acl(name, resource, resource_name, operation)], request_timeout=30).values():
        future.result(timeout=45)


def _revoke(secured_kafka, name: str, resource: str, resource_name: str, operation: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(secured_kafka.admin)
    acl = _acl(name, resource, resource_name, operation, "AclBindingFilter")
    for future in admin.delete_acls([acl], request_timeout=30).values():
        assert future.result(timeout=45), f"no ACL matched {acl}"
