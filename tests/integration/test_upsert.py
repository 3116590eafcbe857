"""The upsert sink against the topic's own compaction: the table holds each key's latest committed record
(by offset within a partition, or by a `version`), deletes applied, through batches, task splits,
transactions, Debezium envelopes, rewinds, replays and the replay horizon.

The ground truth is this file's own compaction of the topic, read with a plain read_committed consumer
and Python's json (tests/integration/helpers.py): the last record per key in the chosen order, a
tombstone, a Debezium delete or the delete condition removing the key.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from kafka_batch.config import load_pipeline
from tests.integration.helpers import (
    batches_of,
    committed_records,
    create_topic,
    kafka_config,
    positions,
    query,
    run_cli,
    update_pipeline,
)

pytestmark = pytest.mark.integration

FIELDS = {"customer_id": "string", "name": "string", "balance": "long", "updated_at": "long"}
COLUMNS = {"name": "name", "balance": {"expr": "balance", "type": "bigint"}}


def upsert_pipeline(prefix: str, partitions: int = 3, key: str = "CAST(key AS STRING)", columns: dict = COLUMNS,
                    envelope: str | None = None, topic_config: dict[str, str] | None = None, **settings):
    """A customers pipeline with one upsert sink on a new topic (created with `topic_config`); `settings` go
    to the sink (version, delete_when) or, for limits and replayable, to the pipeline."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    sink = {"table": name, "key": {"customer_id": {"expr": key, "type": "text"}}, "columns": columns,
            **{k: v for k, v in settings.items() if k in ("version", "delete_when")}}
    definition = {
        "name": name, "topics": [f"{name}_topic"], "schedule": None,
        "connections": {"spark": os.environ["KAFKA_BATCH_TEST_SPARK_CONN"]},
        "record": {"fields": FIELDS, **({"envelope": envelope} if envelope else {})},
        "sinks": {"upsert": sink},
        **{k: v for k, v in settings.items() if k in ("limits", "replayable")},
    }
    (Path(os.environ["KAFKA_BATCH_PIPELINES_DIR"]) / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    create_topic(f"{name}_topic", partitions, topic_config)
    return load_pipeline(name)


def produce(topic: str, records: list[tuple[int, str | None, object]], producer: Producer | None = None) -> None:
    """(partition, key, value) each: a dict is JSON, bytes are sent as they are, None is a tombstone."""
    own = producer is None
    producer = producer or Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "enable.idempotence": True})
    failed = []
    for partition, key, value in records:
        payload = json.dumps(value) if isinstance(value, dict) else value
        producer.produce(topic, partition=partition, key=key, value=payload,
                         on_delivery=lambda error, _: error is not None and failed.append(error))
    if own:
        assert producer.flush(30) == 0
    assert not failed, failed[:3]  # a record the broker refused would make the test compare less than it says


def customer(key: str, name: str, balance: int, updated_at: int = 0) -> dict:
    return {"customer_id": key, "name": name, "balance": balance, "updated_at": updated_at}


def compacted(topic: str, version=None, deletes=None, row=None, key=None, records=None) -> dict:
    """key -> (row, (partition, offset)) of its latest committed record, deletes applied: the test's own
    compaction. `version(record)` orders records (ties by topic, partition, offset; a tombstone has none
    and is skipped), else (topic, partition, offset) does; `deletes(record)` marks deletes besides
    tombstones; `row(record, partition)` is what the table must hold; `key(key bytes, record)`;
    `records`: some of the topic's committed records (default: all of them)."""
    row = row or (lambda record, _: (record["name"], record["balance"]))
    key = key or (lambda k, _: k.decode())
    latest: dict = {}
    for partition, offset, key_bytes, value, _ in committed_records(topic) if records is None else records:
        try:
            record = None if value is None else json.loads(value)
        except ValueError:
            continue  # invalid: quarantined, never applied
        if version is not None and record is None:
            continue
        k = key(key_bytes, record)
        if k is None:
            continue
        order = ((version(record),) if version else ()) + (topic, partition, offset)
        deleted = record is None or bool(deletes and deletes(record))
        if k not in latest or order > latest[k][0]:
            latest[k] = (order, deleted, None if deleted else row(record, partition), (partition, offset))
    return {k: (r, origin) for k, (_, deleted, r, origin) in latest.items() if not deleted}


def table(pipeline, values: str = "name, balance") -> dict:
    """key -> (values, (partition, offset) of origin) as the sink's table holds them."""
    rows = query(f"SELECT customer_id, {values}, kafka_partition, kafka_offset FROM {pipeline.name}")
    return {r[0]: (tuple(r[1:-2]), (r[-2], r[-1])) for r in rows}


def test_latest_record_per_key_with_deletes_through_batches_splits_and_transactions(services):
    pipeline = upsert_pipeline("upsert", limits={"max_records_per_task": 7, "min_tasks": 4})
    topic = pipeline.topics[0]
    rng = random.Random(7)
    keys = [f"k{n}" for n in range(20)]
    # Each key lives in one partition (a keyed topic); five updates of each, interleaved, so a key's
    # records spread over several task splits of its partition (7 offsets a task).
    produce(topic, [(int(k[1:]) % 3, k, customer(k, f"{k}-v{n}", rng.randrange(1000))) for n in range(5) for k in keys]
            + [(0, "k0", b"not json")])
    run_cli("run", "--pipeline", pipeline.name)
    assert table(pipeline) == compacted(topic)
    assert query("SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %s", pipeline.name) == [(1,)]

    bootstrap = kafka_config()["bootstrap.servers"]
    aborter = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-aborts"})
    opener = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-open"})
    for producer in (aborter, opener):
        producer.init_transactions(30)
    aborter.begin_transaction()
    produce(topic, [(5 % 3, "k5", customer("k5", "aborted", -1)), (1, "k1", None)], aborter)
    aborter.flush(30)
    aborter.abort_transaction()  # neither the update nor the delete ever happened
    produce(topic, [
        (1, "k1", None), (2, "k2", None),                                      # tombstones delete
        (0, "k3", customer("k3", "k3-a", 1)), (0, "k3", None), (0, "k3", customer("k3", "k3-b", 2)),  # ends updated
        (1, "k4", customer("k4", "k4-a", 3)), (1, "k4", None),                 # ends deleted
        (2, "k8", customer("k8", "k8-a", 4)), (2, "k8", customer("k8", "k8-b", 5)),
    ])
    opener.begin_transaction()  # open at plan time: its records wait for a later batch
    produce(topic, [(6 % 3, "k6", customer("k6", "k6-open", 6))], opener)
    opener.flush(30)
    run_cli("run", "--pipeline", pipeline.name)
    truth = compacted(topic)
    assert table(pipeline) == truth
    assert {"k1", "k2", "k4"}.isdisjoint(truth) and truth["k3"][0] == ("k3-b", 2) and truth["k5"][0][0] != "aborted"

    opener.commit_transaction(30)
    produce(topic, [(1, "k1", customer("k1", "k1-back", 7)), (1, "k4", customer("k4", "k4-back", 8))])  # resurrections
    run_cli("run", "--pipeline", pipeline.name)
    truth = compacted(topic)
    assert table(pipeline) == truth
    assert truth["k1"][0] == ("k1-back", 7) and truth["k6"][0] == ("k6-open", 6)


def test_a_producer_that_aborts_and_later_commits_loses_nothing(services):
    """One transactional id, as every exactly-once producer has: 3,000 records committed, 500 aborted, 2,000
    committed; a batch after the abort and one after the last commit. The second batch reads the 2,000
    (a broker that lists an ended abort in every later fetch makes librdkafka drop them all)."""
    pipeline = upsert_pipeline("one_id")
    topic = pipeline.topics[0]
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "transactional.id": topic})
    producer.init_transactions(30)
    rng = random.Random(33)
    keys = [f"c{n:03d}" for n in range(300)]

    def transaction(count: int, commit: bool, name: str) -> None:
        producer.begin_transaction()
        chosen = [rng.choice(keys) for _ in range(count)]
        produce(topic, [(int(k[1:]) % 3, k, None if rng.random() < 0.05 else customer(k, name, rng.randrange(10**6)))
                        for k in chosen], producer)
        assert producer.flush(30) == 0
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)

    transaction(3000, True, "first")
    transaction(500, False, "aborted")
    run_cli("run", "--pipeline", pipeline.name)
    assert table(pipeline) == compacted(topic)
    read_before = sum(n for *_, n, _ in batches_of(pipeline.name))
    transaction(2000, True, "last")
    run_cli("run", "--pipeline", pipeline.name)
    truth = compacted(topic)
    assert table(pipeline) == truth
    assert {name for (name, _), _ in truth.values()} == {"last"}  # every key written again, nothing aborted
    [(records, tombstones)] = query(
        "SELECT sum(records_read), sum(records_tombstone) FROM kafka_batch.ledger WHERE pipeline = %s AND batch_id ="
        " (SELECT max(id) FROM kafka_batch.batches WHERE pipeline = %s)", pipeline.name, pipeline.name)
    assert records + tombstones == 2000 and read_before > 0


def test_a_version_decides_which_record_is_latest_and_a_delete_is_remembered(services):
    pipeline = upsert_pipeline("upsertv", version="updated_at", delete_when="name = 'gone'")
    topic = pipeline.topics[0]
    newest = lambda record: record["updated_at"]  # noqa: E731
    gone = lambda record: record["name"] == "gone"  # noqa: E731
    produce(topic, [
        (0, "a", customer("a", "a-5", 5, updated_at=5)), (0, "a", customer("a", "a-3", 3, updated_at=3)),  # older, later
        (0, "b", customer("b", "b-10", 10, updated_at=10)), (1, "b", customer("b", "b-7", 7, updated_at=7)),  # across partitions
        (2, "c", customer("c", "c-20", 20, updated_at=20)),
        (1, "d", customer("d", "gone", 0, updated_at=30)),
    ])
    run_cli("run", "--pipeline", pipeline.name)
    truth = compacted(topic, version=newest, deletes=gone)
    assert table(pipeline) == truth
    assert truth["a"][0] == ("a-5", 5) and truth["b"][0] == ("b-10", 10) and "d" not in truth

    produce(topic, [
        (2, "c", customer("c", "c-15", 15, updated_at=15)),   # older than the stored row: ignored
        (2, "c", customer("c", "c-20b", 21, updated_at=20)),  # the same version, a later offset: wins the tie
        (0, "d", customer("d", "d-25", 25, updated_at=25)),   # older than the remembered delete: stays deleted
        (1, "e", customer("e", "e-1", 1, updated_at=1)),
    ])
    run_cli("run", "--pipeline", pipeline.name)
    truth = compacted(topic, version=newest, deletes=gone)
    assert table(pipeline) == truth
    assert truth["c"][0] == ("c-20b", 21) and "d" not in truth

    produce(topic, [(0, "d", customer("d", "d-31", 31, updated_at=31))])  # newer than the delete: back
    run_cli("run", "--pipeline", pipeline.name)
    truth = compacted(topic, version=newest, deletes=gone)
    assert table(pipeline) == truth and truth["d"][0] == ("d-31", 31)
    assert query(f"SELECT row_version FROM {pipeline.name} WHERE customer_id = 'd'") == [(31,)]


def _change(op: str, lsn: int, before: dict | None, after: dict | None, wrapped: bool) -> dict:
    event = {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000 + lsn,
             "source": {"connector": "postgresql", "db": "shop", "table": "customers", "lsn": lsn, "txId": lsn // 10}}
    return {"schema": {"type": "struct", "name": "customers.Envelope"}, "payload": event} if wrapped else event


def test_debezium_change_events_mirror_the_source_table(services):
    pipeline = upsert_pipeline("cdc", partitions=2, key="customer_id", envelope="debezium", version="source.lsn",
                               limits={"max_invalid_ratio": 0.5})
    topic = pipeline.topics[0]
    rows = {k: customer(k, f"{k}-0", 0) for k in ("a", "b", "c", "d")}
    key_only = lambda k: {"customer_id": k}  # noqa: E731 - REPLICA IDENTITY DEFAULT: a delete's before has the key only
    events = [
        (0, "a", _change("r", 10, None, rows["a"], wrapped=True)),   # snapshot read: an upsert
        (1, "b", _change("c", 11, None, rows["b"], wrapped=False)),
        (0, "c", _change("c", 12, None, rows["c"], wrapped=True)),
        (1, "b", _change("u", 13, rows["b"], customer("b", "b-1", 1), wrapped=False)),
        (0, "c", _change("d", 14, key_only("c"), None, wrapped=True)),
        (0, "c", None),                                               # Debezium's tombstone after a delete
        (1, "d", _change("c", 15, None, rows["d"], wrapped=False)),
        (1, "d", _change("t", 16, None, None, wrapped=False)),        # a truncate: not a row change
    ]
    produce(topic, events)
    run_cli("run", "--pipeline", pipeline.name)

    def decoded(record):
        return None if record is None else record.get("payload", record)

    def truth():
        return compacted(
            topic, version=lambda r: decoded(r)["source"]["lsn"], deletes=lambda r: decoded(r)["op"] == "d",
            key=lambda _, r: None if decoded(r)["op"] not in "curd" else (decoded(r)["before"] if decoded(r)["op"] == "d"
                                                                           else decoded(r)["after"])["customer_id"],
            row=lambda r, _: (decoded(r)["after"]["name"], decoded(r)["after"]["balance"]))

    assert table(pipeline) == truth()
    assert set(truth()) == {"a", "b", "d"}
    [(reason,)] = query("SELECT reason FROM kafka_batch.quarantine WHERE pipeline = %s", pipeline.name)
    assert reason == "Debezium op 't' is not a row change (c, u, r, d)"

    produce(topic, [
        (0, "c", _change("c", 20, None, customer("c", "c-back", 9), wrapped=True)),  # resurrected
        (1, "b", _change("u", 12, rows["b"], customer("b", "b-stale", 2), wrapped=False)),  # an older lsn, late
    ])
    run_cli("run", "--pipeline", pipeline.name)
    assert table(pipeline) == truth()
    assert truth()["c"][0] == ("c-back", 9) and truth()["b"][0] == ("b-1", 1)


def _produce_rounds(topic: str, partitions: int, seed: int) -> None:
    """30 updates and tombstones of 12 keys, each key in one partition."""
    rng = random.Random(seed)
    records = []
    for n in range(30):
        k = f"k{rng.randrange(12)}"
        value = None if rng.random() < 0.15 else customer(k, f"{k}-{seed}-{n}", rng.randrange(1000))
        records.append((int(k[1:]) % partitions, k, value))
    produce(topic, records)


def test_rewind_rerun_replay_and_the_horizon_stay_exact(services):
    pipeline = upsert_pipeline("upsertrw", partitions=2)
    topic = pipeline.topics[0]
    for seed in (1, 2, 3):
        _produce_rounds(topic, 2, seed)
        run_cli("run", "--pipeline", pipeline.name)
    committed = positions(pipeline.name)
    assert table(pipeline) == compacted(topic)

    # Rewind partition 0 into the history: the table is the compaction of what is below the positions.
    run_cli("reset", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "0", "--to-offset", "20",
            "--reason", "test", "--execute")
    rewound = positions(pipeline.name)
    assert rewound[(topic, 0)] <= 20
    below = {p: o for (_, p), o in rewound.items()}
    kept = [r for r in committed_records(topic) if r[1] < below[r[0]]]
    assert table(pipeline) == compacted(topic, records=kept)
    run_cli("run", "--pipeline", pipeline.name)
    assert positions(pipeline.name) == committed and table(pipeline) == compacted(topic)

    # Replay partition 1 after changing a column: exactly the keys its ranges touched are recomputed.
    tenfold = {"name": "name", "balance": {"expr": "balance * 10", "type": "bigint"}}
    sink = {"table": pipeline.name, "key": {"customer_id": {"expr": "CAST(key AS STRING)", "type": "text"}}}
    update_pipeline(pipeline.name, sinks={"upsert": {**sink, "columns": tenfold}})
    before = table(pipeline)
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "1", "--from", "0",
            "--until", str(committed[(topic, 1)]), "--dry-run", "--run-id", "preview")
    assert table(pipeline) == before
    preview = query("SELECT p.group_key->>'customer_id', p.before->>'balance', p.after->>'balance'"
                    " FROM kafka_batch.replay_previews p JOIN kafka_batch.batches b ON b.id = p.batch_id"
                    " WHERE b.pipeline = %s AND b.run_id = 'preview'", pipeline.name)
    in_p1 = {k: v for k, v in before.items() if v[1][0] == 1}
    assert {k: (int(b), int(a)) for k, b, a in preview} == {k: (v[0][1], v[0][1] * 10) for k, v in in_p1.items()
                                                          if v[0][1] != 0}
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic, "--partitions", "1", "--from", "0",
            "--until", str(committed[(topic, 1)]))
    assert table(pipeline) == compacted(topic, row=lambda r, p: (r["name"], r["balance"] * (10 if p == 1 else 1)))


def test_a_rewind_past_the_horizon_is_refused_and_folding_keeps_the_table(services):
    pipeline = upsert_pipeline("upserth", partitions=1, replayable={"batches": 1})
    topic = pipeline.topics[0]
    for seed in (4, 5, 6):
        _produce_rounds(topic, 1, seed)
        run_cli("run", "--pipeline", pipeline.name)
    assert table(pipeline) == compacted(topic)  # folding the older ranges changed nothing
    assert query(f"SELECT count(*) FROM kafka_batch.{pipeline.name}__history WHERE range_id = 0")[0][0] > 0
    before, at = table(pipeline), positions(pipeline.name)
    result = run_cli("reset", "--pipeline", pipeline.name, "--topic", topic, "--to-offset", "0", "--reason", "test",
                     "--execute", check=False)
    assert result.returncode == 2 and "folded" in result.stderr, result.stderr
    assert table(pipeline) == before and positions(pipeline.name) == at
