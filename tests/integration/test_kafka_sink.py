"""The Kafka sink end to end: a pipeline that totals page views in Postgres and publishes every view to
a topic, through batches, invalid records, input transactions that abort and commit, and a Postgres
commit that fails after the Kafka publish. Ground truth is the input topic read by a plain consumer and
the output topic read by a plain read_committed consumer: one message per valid committed input record,
each exactly once, in the batch the ledger says read it."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    _committed_messages,
    admin_client,
    batches_of,
    create_topic,
    ground_truth,
    kafka_config,
    new_pipeline,
    pg_connect,
    positions,
    query,
    run_cli,
    update_pipeline,
)
from tests.integration.test_end_to_end import _produce, _transactional_page_views
from tests.integration.test_kafka_publish import _attempt

pytestmark = pytest.mark.integration

# Fails the Postgres commit of a flagged pipeline's batch at COMMIT time: after the sink's Kafka publish,
# which runs last inside the transaction. A deferred constraint trigger, so nothing in the code knows.
FAULT = """
CREATE TABLE IF NOT EXISTS public.{name}_fail_commit (pipeline text PRIMARY KEY);
CREATE OR REPLACE FUNCTION public.{name}_fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'committed' AND EXISTS (SELECT 1 FROM public.{name}_fail_commit f WHERE f.pipeline = NEW.pipeline) THEN
    RAISE EXCEPTION 'injected: the Postgres commit fails after the Kafka publish';
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER {name}_fail_commit AFTER UPDATE ON kafka_batch.batches DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION public.{name}_fail_commit();
"""


def _execute(statement: str, *params) -> None:
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute(statement, params)
    conn.close()


def fail_commit_after_publish(name: str) -> None:
    """One run of the pipeline whose Postgres commit fails after its Kafka publish (FAULT)."""
    _execute(FAULT.format(name=name))
    try:
        _execute(f"INSERT INTO public.{name}_fail_commit VALUES (%s)", name)
        failed = run_cli("run", "--pipeline", name, check=False)
        assert failed.returncode != 0 and "injected" in failed.stderr, failed.stderr
        _execute(f"DELETE FROM public.{name}_fail_commit")
    finally:
        _execute(f"DROP TRIGGER IF EXISTS {name}_fail_commit ON kafka_batch.batches")


def _output(topic: str, partitions=(0, 1)) -> list[dict]:
    found = []
    for message in _committed_messages(topic, list(partitions)):
        headers = {k: v.decode() for k, v in message.headers() or []}
        found.append({"key": message.key(), "value": json.loads(message.value()), "partition": message.partition(),
                      **headers})
    return found


def test_every_valid_record_is_published_once_through_batches_and_a_failed_commit(services):
    output = f"kafkasink_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 2)
    pipeline = new_pipeline("kafkasink", limits={"max_records_per_batch": 250}, sinks={"kafka": {
        "topic": output, "key": "user_id", "value": {"page": "page", "ms": {"expr": "duration_ms", "type": "bigint"}}}})
    topic = pipeline.topics[0]
    bad = _produce(topic, [b"{not json"], partition=0)
    sample_data.produce_page_views(kafka_config(), topic, 400, seed=81)
    _transactional_page_views(topic, transactions=6, size=20, seed=82)  # one id aborts, then commits again

    run_cli("run", "--pipeline", pipeline.name)  # the first batch publishes
    name = pipeline.name
    fail_commit_after_publish(name)
    # Its messages are in Kafka, its Postgres commit is not. The next run takes that batch up again (a new
    # plan would publish its records a second time), and its second attempt only commits Postgres.
    run_cli("run", "--pipeline", name)
    assert [s for _, _, s, *_ in batches_of(name)] == ["committed", "committed"]  # no new batch was planned
    assert query("SELECT attempt FROM kafka_batch.batches WHERE pipeline = %s ORDER BY id", name) == [(1,), (2,)]
    for _ in range(4):
        run_cli("run", "--pipeline", name)

    # Ground truth from the input topic: every valid committed record, with the offset it came from.
    expected = {}
    for message in _committed_messages(topic, [0, 1, 2]):
        try:
            record = json.loads(message.value())
        except ValueError:
            continue
        expected[f"{topic}:{message.partition()}:{message.offset()}"] = (
            record["user_id"].encode(), {"page": record["page"], "ms": record["duration_ms"]})
    ends = {(topic, p): max(int(s.split(":")[2]) for s in expected if int(s.split(":")[1]) == p) for p in range(3)}
    assert all(positions(name)[tp] > end for tp, end in ends.items())  # everything was read
    published = _output(output)
    assert Counter(m["kafka_batch.source"] for m in published) == Counter(dict.fromkeys(expected, 1))
    assert {m["kafka_batch.source"]: (m["key"], m["value"]) for m in published} == expected
    # In the input's order: in each output partition, the records of each input partition by offset.
    sequences = defaultdict(list)
    for m in published:
        _, partition, offset = m["kafka_batch.source"].split(":")
        sequences[m["partition"], int(partition)].append(int(offset))
    assert len(sequences) == 2 * 3 and all(offsets == sorted(offsets) for offsets in sequences.values())
    # Each message names the batch the ledger says read its record, and that batch's range.
    ledger = query("SELECT batch_id, partition, from_offset, until_offset FROM kafka_batch.ledger WHERE pipeline = %s",
                   name)
    for m in published:
        _, partition, offset = m["kafka_batch.source"].split(":")
        [(batch_id, lo, hi)] = [(b, lo, hi) for b, p, lo, hi in ledger if p == int(partition) and lo <= int(offset) < hi]
        assert (m["kafka_batch.batch"], m["kafka_batch.range"], m["kafka_batch.kind"], m["kafka_batch.pipeline"]) == (
            str(batch_id), f"{topic}:{partition}:{lo}-{hi}", "batch", name)
    assert [s for _, _, s, *_ in batches_of(name)].count("committed") >= 3
    # What the ledger says each batch published (its metrics): the messages naming it in the topic; none
    # for the batch whose second attempt found them published by the first and only committed Postgres.
    per_batch = Counter(int(m["kafka_batch.batch"]) for m in published)
    said = query("SELECT id, attempt, (published -> %s ->> 'messages')::int FROM kafka_batch.batches"
                 " WHERE pipeline = %s", output, name)
    assert [(n, per_batch[b] > 0) for b, attempt, n in said if attempt == 2] == [(0, True)]
    assert {b: n for b, attempt, n in said if attempt == 1} == {b: per_batch[b] for b, attempt, _ in said if attempt == 1}
    # The Postgres side holds the same records once (the aggregate sink's totals).
    valid = ground_truth(topic, select=lambda partition, offset: (partition, offset) != (0, bad[0]))
    assert sum(v for v, _ in valid.values()) == len(expected)
    assert query(f"SELECT sum(views) FROM public.{name}_minutes") == [(len(expected),)]


def test_status_shows_the_sink_and_fence_ends_a_killed_attempts_open_transaction(services):
    output = f"kafkafence_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 2)
    pipeline = new_pipeline("kafkafence", partitions=1, sinks={"kafka": {"topic": output, "value": {"page": "page"}}})
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 50, seed=83)
    run_cli("run", "--pipeline", pipeline.name)
    (batch_id,), = query("SELECT id FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name)

    # An attempt killed while producing leaves its transaction open: readers of the topic wait at it.
    killed = _attempt({"pipeline": pipeline.name, "topic": output, "batch": 99, "attempt": 1, "count": 40,
                       "ranges": [[pipeline.topics[0], 0, 50, 60]], "crash": "producing"})
    assert killed.returncode == -9, killed.stderr
    state = json.loads(run_cli("status", "--pipeline", pipeline.name, "--json").stdout)["kafka_sinks"]
    [sink] = state
    assert sink["last_published"]["batch_id"] == batch_id
    assert sink["open_transactions"] and all(t["stable"] < t["end"] and t["since"] for t in sink["open_transactions"])
    text = run_cli("status", "--pipeline", pipeline.name).stdout
    assert "an open transaction holds readers at offset" in text

    fenced = run_cli("fence", "--pipeline", pipeline.name, "--reason", "a killed attempt", "--by", "ops")
    assert fenced.stdout.strip().splitlines() == [
        f"fenced kafka-batch.{pipeline.name}.{output} (pipeline {pipeline.name}, topic {output}): its open transaction,"
        " if any, is aborted; by ops: a killed attempt"]
    state = json.loads(run_cli("status", "--pipeline", pipeline.name, "--json").stdout)["kafka_sinks"]
    assert state[0]["open_transactions"] == []
    # The killed attempt's messages never became visible; the batch's are there once.
    assert sorted(int(m["kafka_batch.source"].split(":")[2]) for m in _output(output)) == list(range(50))

    # A replay publishes the records of the ranges it recomputes again, marked as a replay.
    run_cli("replay", "--pipeline", pipeline.name, "--topic", pipeline.topics[0], "--partitions", "0",
            "--from", "0", "--until", "10", "--reason", "republish")
    (replay_id,), = query("SELECT id FROM kafka_batch.batches WHERE pipeline = %s AND kind = 'replay'", pipeline.name)
    again = [m for m in _output(output) if m["kafka_batch.kind"] == "replay"]
    assert sorted(int(m["kafka_batch.source"].split(":")[2]) for m in again) == list(range(50))  # the whole range
    assert {m["kafka_batch.batch"] for m in again} == {str(replay_id)}


@pytest.mark.parametrize("alone", [False, True], ids=["beside-an-aggregate", "alone"])
def test_messages_go_out_in_offset_order_when_a_range_is_read_by_several_tasks_and_a_replay_by_many(services, alone):
    # Tasks of at most 3 offsets: 10 offsets make pieces of 2, 3, 2 and 3, which packing (biggest first)
    # would read as 2-4, 7-9, 0-1, 5-6; and a replay of both batches (10 and 7 offsets) reads part of the
    # later range before the earlier one is complete. The output has one partition: its order is total.
    # More tasks than cores: the sink takes the records in waves, of the persisted read beside an aggregate,
    # each read on its own when it is the pipeline's only sink.
    output = f"kafkaorder_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 1)
    pipeline = new_pipeline("kafkaorder", partitions=1, limits={"max_records_per_task": 3},
                            sinks={"kafka": {"topic": output, "value": {"page": "page"}},
                                   **({"aggregate": None} if alone else {})})
    assert len(pipeline.sinks) == (1 if alone else 2)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 10, seed=88)
    run_cli("run", "--pipeline", pipeline.name)
    sample_data.produce_page_views(kafka_config(), topic, 7, seed=89)
    run_cli("run", "--pipeline", pipeline.name)
    assert query("SELECT from_offset, until_offset FROM kafka_batch.ledger WHERE pipeline = %s ORDER BY 1",
                 pipeline.name) == [(0, 10), (10, 17)]
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "0", "--from", "0", "--until",
            "17", "--reason", "order")

    def offsets(kind: str) -> list[int]:
        return [int(m["kafka_batch.source"].split(":")[2]) for m in _output(output, (0,)) if m["kafka_batch.kind"] == kind]

    assert offsets("batch") == list(range(17))
    assert offsets("replay") == list(range(17))


def test_messages_carry_only_the_headers_asked_for(services):
    output = f"kafkaheaders_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 1)
    pipeline = new_pipeline("kafkaheaders", partitions=1, sinks={"aggregate": None, "kafka": {
        "topic": output, "key": "user_id", "value": {"page": "page"}, "headers": []}})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 20, seed=90)
    run_cli("run", "--pipeline", pipeline.name)
    expected = [(m.key(), {"page": json.loads(m.value())["page"]}) for m in _committed_messages(topic, [0])]
    published = list(_committed_messages(output, [0]))
    assert [(m.key(), json.loads(m.value())) for m in published] == expected
    assert all(m.headers() is None for m in published)
    update_pipeline(pipeline.name, sinks={"kafka": {"topic": output, "key": "user_id", "value": {"page": "page"},
                                                    "headers": ["batch", "source"]}})
    sample_data.produce_page_views(kafka_config(), topic, 5, seed=91)
    run_cli("run", "--pipeline", pipeline.name)
    later = list(_committed_messages(output, [0]))[20:]
    assert [[k for k, _ in m.headers()] for m in later] == [["kafka_batch.batch", "kafka_batch.source"]] * 5
    assert [m.headers()[1][1].decode() for m in later] == [f"{topic}:0:{offset}" for offset in range(20, 25)]


SINK_TRANSACTION_TIMEOUT_S = 5
COORDINATOR_WAIT_S = 25  # what the test waits for the coordinator, fixed: a sink timeout past it turns it red


def _stable_and_end(topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
    """Per partition, (last stable offset, high watermark), as the broker lists them."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    admin = admin_client()  # kept while its futures run: they end with it

    def latest(isolation) -> dict[int, int]:
        asked = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
        found = admin.list_offsets(asked, isolation_level=isolation, request_timeout=30)
        return {tp.partition: future.result().offset for tp, future in found.items()}

    stable, end = latest(IsolationLevel.READ_COMMITTED), latest(IsolationLevel.READ_UNCOMMITTED)
    return {p: (stable[p], end[p]) for p in partitions}


def test_the_coordinator_aborts_a_killed_attempts_transaction_after_the_sinks_timeout(services):
    output = f"kafkatimeout_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 2)
    pipeline = new_pipeline("kafkatimeout", partitions=1, limits={"max_records_per_batch": 1000},
                            read={"kafka_timeout_seconds": 1},
                            sinks={"kafka": {"topic": output, "value": {"page": "page"},
                                             "transaction_timeout_seconds": SINK_TRANSACTION_TIMEOUT_S}})
    [sink] = [sink for sink in pipeline.sinks if sink.kind == "kafka"]
    killed = _attempt({"pipeline": pipeline.name, "topic": output, "batch": 7, "attempt": 1, "count": 40,
                       "ranges": [[pipeline.topics[0], 0, 0, 40]], "crash": "producing",
                       "transaction_timeout_ms": sink.transaction_timeout_seconds * 1000})
    died = time.monotonic()
    assert killed.returncode == -9, killed.stderr
    held = _stable_and_end(output, [0, 1])
    assert any(stable < end for stable, end in held.values()), held  # readers wait at the open transaction

    # Nobody fences it: the transaction coordinator aborts it once it is older than the producer's timeout.
    while any(stable < end for stable, end in _stable_and_end(output, [0, 1]).values()):
        assert time.monotonic() - died < COORDINATOR_WAIT_S, "the coordinator did not abort the transaction"
        time.sleep(0.5)
    waited = time.monotonic() - died
    ends = _stable_and_end(output, [0, 1])
    assert all(stable == end for stable, end in ends.values()) and sum(end for _, end in ends.values()) > 20
    assert waited >= SINK_TRANSACTION_TIMEOUT_S - 2, waited  # its timeout, not something sooner, ended it
    assert _output(output) == []  # read_committed readers moved on past records that never became visible

    # The pipeline's own batch then publishes each record once.
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 30, seed=87)
    run_cli("run", "--pipeline", pipeline.name)
    assert sorted(int(m["kafka_batch.source"].split(":")[2]) for m in _output(output)) == list(range(30))


def test_a_message_over_the_size_limit_is_quarantined_and_a_missing_topic_changes_nothing(services):
    output = f"kafkasize_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 1)
    pipeline = new_pipeline("kafkasize", partitions=1, sinks={
        "aggregate": {"table": f"kafkasize_{uuid.uuid4().hex[:8]}", "group_by": {"page": "page"},
                      "measures": {"views": {"expr": "1"}}},
        "kafka": {"topic": output, "value": {"page": "page"}, "max_message_bytes": 1000}})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 30, seed=84)
    big = json.dumps({"user_id": "u", "page": "/" + "x" * 300, "duration_ms": 1}).encode()
    [fits] = _produce(topic, [big])  # key "u", value {"page":"/xxx..."}: 1 + 312 + 512 for headers <= 1000
    [over] = _produce(topic, [big.replace(b"x" * 300, b"y" * 900)])  # 1 + 912 + 512 > 1000
    run_cli("run", "--pipeline", pipeline.name)
    [(offset, reason)] = query('SELECT "offset", reason FROM kafka_batch.quarantine WHERE pipeline = %s', pipeline.name)
    assert offset == over and "over sinks.kafka.max_message_bytes 1000" in reason, reason
    assert f"its message to Kafka topic {output} would be 1" in reason
    published = sorted(int(m["kafka_batch.source"].split(":")[2]) for m in _output(output, [0]))
    assert published == [o for o in range(over + 1) if o != over] and fits in published
    assert query(f"SELECT sum(views) FROM public.{pipeline.sink_settings.aggregate.table}") == [(31,)]

    # A sink whose topic is missing: one line, nothing committed, the positions where they were.
    before = positions(pipeline.name)
    update = dict(pipeline.definition["sinks"], kafka={"topic": f"{output}_missing", "value": {"page": "page"}})
    update_pipeline(pipeline.name, sinks=update)
    sample_data.produce_page_views(kafka_config(), topic, 5, seed=85)
    failed = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert failed.returncode != 0 and f"topic '{output}_missing' does not exist" in failed.stderr, failed.stderr
    assert positions(pipeline.name) == before
    assert query(f"SELECT sum(views) FROM public.{pipeline.sink_settings.aggregate.table}") == [(31,)]


def test_a_sink_publishes_to_another_cluster_through_its_own_connection(second_cluster):
    output = f"kafkaother_{uuid.uuid4().hex[:8]}_out"
    admin = AdminClient({"bootstrap.servers": second_cluster})
    admin.create_topics([NewTopic(output, 1, 1)])[output].result()
    pipeline = new_pipeline("kafkaother", partitions=1, connections={"kafka_output": "kafka_elsewhere"},
                            sinks={"kafka": {"topic": output, "value": {"page": "page"}}})
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 40, seed=86)

    # The output connection is resolved before anything is read: undefined, the run stops at once.
    missing = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert missing.returncode != 0 and "connection 'kafka_elsewhere' is not defined" in missing.stderr, missing.stderr
    assert positions(pipeline.name) in ({}, {(pipeline.topics[0], 0): 0})

    elsewhere = {"AIRFLOW_CONN_KAFKA_ELSEWHERE": json.dumps({"conn_type": "kafka",
                                                             "extra": {"bootstrap.servers": second_cluster}})}
    run_cli("run", "--pipeline", pipeline.name, env=elsewhere)
    assert positions(pipeline.name) == {(pipeline.topics[0], 0): 40}
    # On the second cluster, read by a plain read_committed consumer; the pipeline's cluster has no such topic.
    consumer = Consumer({"bootstrap.servers": second_cluster, "group.id": f"truth-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(output, 0, OFFSET_BEGINNING)])
    found = []
    while not found or not found[-1].error():
        found += consumer.consume(100, timeout=10) or [None]
        assert found[-1] is not None, "no end of partition from the second cluster"
    consumer.close()
    sources = sorted(int(dict(m.headers())["kafka_batch.source"].decode().split(":")[2]) for m in found[:-1])
    assert sources == list(range(40))
    assert output not in admin_client().list_topics(timeout=30).topics
    state = json.loads(run_cli("status", "--pipeline", pipeline.name, "--json", env=elsewhere).stdout)["kafka_sinks"]
    assert state[0]["last_published"]["batch_id"] == query(
        "SELECT max(id) FROM kafka_batch.batches WHERE pipeline = %s", pipeline.name)[0][0]


def test_avro_values_through_the_registry_read_back_by_confluents_deserializer(services):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.integration.test_avro import registry_url

    output = f"kafkaavro_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 2)
    pipeline = new_pipeline("kafkaavro", partitions=2, sinks={"kafka": {
        "topic": output, "key": "user_id", "value_format": "avro",
        "value": {"page": "page", "ms": {"expr": "duration_ms", "type": "bigint"},
                  "at": {"expr": "timestamp", "type": "timestamptz"}, "day": {"expr": "to_date(timestamp)", "type": "date"},
                  "half": {"expr": "duration_ms / 2", "type": "double precision"}, "long_view": {
                      "expr": "duration_ms > 30000", "type": "boolean"}, "missing": "CAST(NULL AS STRING)"}}})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 60, seed=87)
    run_cli("run", "--pipeline", pipeline.name)

    # Ground truth: the input topic read by a plain consumer and json; the output by Confluent's deserializer.
    expected = {}
    for message in _committed_messages(topic, [0, 1]):
        record, at = json.loads(message.value()), datetime.fromtimestamp(message.timestamp()[1] / 1000, UTC)
        expected[f"{topic}:{message.partition()}:{message.offset()}"] = (record["user_id"], {
            "page": record["page"], "ms": record["duration_ms"], "at": at, "day": at.date(),
            "half": record["duration_ms"] / 2, "long_view": record["duration_ms"] > 30000, "missing": None})
    client = SchemaRegistryClient({"url": registry_url()})
    deserialize = AvroDeserializer(client)
    found = {}
    for message in _committed_messages(output, [0, 1]):
        headers = {k: v.decode() for k, v in message.headers()}
        value = deserialize(message.value(), SerializationContext(output, MessageField.VALUE))
        found[headers["kafka_batch.source"]] = (message.key().decode(), value)
    assert found == expected
    registered = client.get_latest_version(f"{output}-value").schema.schema_str
    fields = json.loads(registered)["fields"]  # in the definition's order, each a union with null
    assert [f["name"] for f in fields] == [c.name for c in pipeline.sink_settings.kafka.value]
    assert all(f["type"][0] == "null" and f["default"] is None for f in fields)


def test_a_value_schema_the_subjects_compatibility_refuses_stops_the_batch_in_one_line_publishing_nothing(services):
    """The Avro value schema follows the output's columns: a column added is accepted (BACKWARD: a union
    with null, default null); a column's type changed is refused by the subject's rule, and the batch stops
    with one line naming the subject and the rule, nothing published, nothing committed. Once the
    subject's owner relaxes its rule, the same batch goes through, each record published once."""
    from tests.integration.test_avro import registry_client

    output = f"kafkacompat_{uuid.uuid4().hex[:8]}_out"
    subject = f"{output}-value"
    create_topic(output, 1)
    value = {"page": "page", "ms": {"expr": "duration_ms", "type": "bigint"}}
    pipeline = new_pipeline("kafkacompat", partitions=1, sinks={"kafka": {"topic": output, "value_format": "avro",
                                                                         "value": value}})
    topic, sinks = pipeline.topics[0], pipeline.definition["sinks"]

    def publish(columns: dict, count: int, seed: int, check: bool = True):
        update_pipeline(pipeline.name, sinks={**sinks, "kafka": {**sinks["kafka"], "value": columns}})
        sample_data.produce_page_views(kafka_config(), topic, count, seed=seed)
        return run_cli("run", "--pipeline", pipeline.name, check=check)

    def published() -> Counter:
        return Counter(dict(m.headers())["kafka_batch.source"].decode() for m in _committed_messages(output, [0]))

    registry = registry_client()
    publish(value, 40, 201)
    publish({**value, "user": "user_id"}, 40, 202)  # a column added: accepted
    assert registry.get_versions(subject) == [1, 2] and registry.get_compatibility() == "BACKWARD"
    before, stored = published(), positions(pipeline.name)
    said = publish({**value, "ms": {"expr": "CAST(duration_ms AS STRING)", "type": "text"}, "user": "user_id"}, 40, 203,
                   check=False)  # a long read as a string: refused
    assert said.returncode == 2, said.stderr[-3000:]
    [line] = said.stderr.strip().splitlines()
    assert line.startswith("kafka-batch: invalid input: ") and (
        f"the schema registry refused the value schema for subject '{subject}' (HTTP 409: Schema being registered is"
        " incompatible") in line, line
    assert "compatibility: 'BACKWARD'" in line, line
    assert published() == before and positions(pipeline.name) == stored and registry.get_versions(subject) == [1, 2]
    # The subject's owner relaxes its rule: the planned batch goes through, and every record is published once.
    registry.set_compatibility(subject, "NONE")
    run_cli("run", "--pipeline", pipeline.name)
    everything = {f"{topic}:0:{m.offset()}" for m in _committed_messages(topic, [0])}
    assert published() == Counter(everything) and len(everything) == 120


def test_protobuf_values_read_back_with_a_class_protoc_builds_from_the_documented_schema(services):
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.integration.test_protobuf import message_class

    output = f"kafkaproto_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 1)
    pipeline = new_pipeline("kafkaproto", partitions=1, sinks={"kafka": {
        "topic": output, "value_format": "protobuf", "value": {  # names in the definition's (sorted) order
            "a_page": "page", "b_ms": {"expr": "duration_ms", "type": "bigint"},
            "c_at": {"expr": "timestamp", "type": "timestamptz"}, "d_day": {"expr": "to_date(timestamp)", "type": "date"},
            "e_half": {"expr": "duration_ms / 2", "type": "double precision"},
            "f_long": {"expr": "duration_ms > 30000", "type": "boolean"}, "g_missing": "CAST(NULL AS STRING)"}}})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 40, seed=88)
    run_cli("run", "--pipeline", pipeline.name)

    # The schema as README and kafka_batch.formats.writing describe it, compiled by protoc here.
    schema = ('syntax = "proto3";\npackage kafka_batch;\nimport "google/protobuf/timestamp.proto";\n'
              f"message {output} {{ optional string a_page = 1; optional int64 b_ms = 2;"
              " google.protobuf.Timestamp c_at = 3; optional string d_day = 4; optional double e_half = 5;"
              " optional bool f_long = 6; optional string g_missing = 7; }\n")
    deserialize = ProtobufDeserializer(message_class(schema, f"kafka_batch.{output}"), {"use.deprecated.format": False})
    expected = []
    for message in _committed_messages(topic, [0]):
        record, at = json.loads(message.value()), datetime.fromtimestamp(message.timestamp()[1] / 1000, UTC)
        ms = record["duration_ms"]
        expected.append((record["page"], ms, at, at.date().isoformat(), ms / 2, ms > 30000, False))
    found = []
    for message in _committed_messages(output, [0]):
        m = deserialize(message.value(), SerializationContext(output, MessageField.VALUE))
        at = datetime.fromtimestamp(m.c_at.seconds, UTC).replace(microsecond=m.c_at.nanos // 1000)
        found.append((m.a_page, m.b_ms, at, m.d_day, m.e_half, m.f_long, m.HasField("g_missing")))
    assert found == expected
