"""Ground truth: the verifying producer's records, and the independent checker.

The records are traceable (unique ids, integer amounts) and written in transactions of two transactional
ids, a third of them aborted; the checker reads the topics with a plain read_committed consumer
(kafka_batch_dev.committed) and shares no code with the pipeline's reader.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Producer

from kafka_batch_dev.chaos.harness import APP, PAGES, kafka_bootstrap, sql
from kafka_batch_dev.committed import committed_messages

# --- the verifying producer --------------------------------------------------------------------------

# The Avro scenarios' records: what the JSON ones hold.
AVRO_SCHEMA = {"type": "record", "name": "ChaosRecord", "fields": [
    {"name": "id", "type": "string"}, {"name": "page", "type": "string"}, {"name": "amount", "type": "long"}]}


def registry_client():
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conn = json.loads(os.environ["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    return SchemaRegistryClient({"url": f"{conn.get('schema') or 'http'}://{conn['host']}:{conn['port']}"})


class Codec:
    """How the suite writes and reads a record's value: JSON, or Avro through the Schema Registry."""

    def __init__(self, topic: str, avro: bool):
        self.avro = avro
        if avro:
            from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
            from confluent_kafka.serialization import MessageField, SerializationContext

            client = registry_client()
            self.context = SerializationContext(topic, MessageField.VALUE)
            self.serializer = AvroSerializer(client, json.dumps(AVRO_SCHEMA))
            self.deserializer = AvroDeserializer(client, json.dumps(AVRO_SCHEMA))

    def encode(self, record: dict) -> bytes:
        return self.serializer(record, self.context) if self.avro else json.dumps(record).encode()

    def decode(self, value: bytes) -> dict:
        """The record, or ValueError (not a record of the suite's: invalid)."""
        if not self.avro:
            return json.loads(value)
        try:
            return self.deserializer(value, self.context)
        except Exception as exc:  # noqa: BLE001 - the deserializer's errors have no common base
            raise ValueError(str(exc)) from None


# The input producers' transaction.timeout.ms: a transaction held open across a plan waits for the strike and
# the recovery after it (librdkafka's default, 60 s, is shorter than some); at most the broker's 15 minutes.
HELD_TRANSACTION_TIMEOUT_MS = 600_000


def transactional_producers(topic: str, count: int = 2) -> list[Producer]:
    """The topic's transactional producers: the same ids every time (a producer that aborted in one
    iteration commits in the next; a new one fences the previous instance of its id)."""
    producers = [Producer({"bootstrap.servers": kafka_bootstrap(), "linger.ms": 5, "transactional.id": f"{topic}-{n}",
                           "transaction.timeout.ms": HELD_TRANSACTION_TIMEOUT_MS}) for n in range(count)]
    for p in producers:
        p.init_transactions(30)
    return producers


def write_transaction(producer: Producer, topic: str, partitions: int, size: int, rng: random.Random,
                      codec: Codec) -> None:
    """Begin a transaction and write `size` unique records to it (about 0.3% of them invalid)."""
    producer.begin_transaction()
    for _ in range(size):
        value = (b"{not json" if rng.random() < 0.003 else
                 codec.encode({"id": uuid.uuid4().hex, "page": rng.choice(PAGES), "amount": rng.randint(1, 1000)}))
        producer.produce(topic, value=value, partition=rng.randrange(partitions))
    producer.flush(60)


def commit_late(producer: Producer) -> None:
    """Commit the transaction `produce` left open. Should it fail as abortable, it is aborted, as an
    exactly-once producer does; should the coordinator have aborted it (open past its timeout, a strike
    and a recovery can outlast), this producer is fenced. Either way its records never show."""
    try:
        producer.commit_transaction()
    except KafkaException as exc:
        if exc.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
            print(f"  the input's open transaction was aborted by the coordinator ({exc.args[0].str()})", flush=True)
            return
        if not exc.args[0].txn_requires_abort():
            raise
        print(f"  the input's open transaction was lost ({exc.args[0].str()}): aborted", flush=True)
        producer.abort_transaction()


def produce(topic: str, partitions: int, count: int, rng: random.Random, open_txn: bool,
            codec: Codec) -> Producer | None:
    """Unique records in transactions of two producers, each committing two in three of its transactions
    and aborting the third (one transactional id aborts and later commits, as exactly-once producers do).

    Returns, if asked, one of them with a transaction left open (to be committed after the plan).
    """
    producers = transactional_producers(topic)
    written = 0
    while written < count:
        size = min(rng.randint(50, 500), count - written)
        producer = rng.choice(producers)
        write_transaction(producer, topic, partitions, size, rng, codec)
        producer.abort_transaction() if rng.random() < 1 / 3 else producer.commit_transaction()
        written += size
    if not open_txn:
        return None
    late = rng.choice(producers)
    write_transaction(late, topic, partitions, 100, rng, codec)
    return late


# --- the independent checker -------------------------------------------------------------------------

# The upsert sink mirrors 256 keys, the first two hex digits of a record's id; a record with an amount of
# at most UPSERT_DELETE_AT_MOST deletes its key (the sink's `delete_when`).
UPSERT_DELETE_AT_MOST = 100


def upsert_key(record_id: str) -> str:
    return record_id[:2]


def published_messages(topic: str) -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
    """(key, value, headers) of every committed message of the Kafka sink's output topic, in each
    partition's order, read_committed from its start."""
    return [(m.key(), m.value(), {k: v.decode() for k, v in m.headers() or []})
            for m in committed_messages({"bootstrap.servers": kafka_bootstrap()}, topic)]


def check_published(topic: str, output: str, shape: str, valid: dict, expected: dict) -> list[str]:
    """The Kafka sink's topic against the same ground truth: rows, each valid record exactly once (by its
    `kafka_batch.source` header); a changelog, per page the last message's totals."""
    messages = published_messages(output)
    if shape == "rows":
        sources = Counter(headers["kafka_batch.source"] for _, _, headers in messages
                          if headers.get("kafka_batch.kind") == "batch")
        wanted = Counter({f"{topic}:{p}:{o}": 1 for p, o in valid})
        if sources != wanted:
            repeated = [s for s, n in sources.items() if n > 1]
            return [f"Kafka sink: {len(repeated)} record(s) published more than once (e.g. {repeated[:3]}),"
                    f" {len(wanted - sources)} valid record(s) not published, {len(sources - wanted - Counter(repeated))}"
                    " published that were not expected"]
        return []
    latest: dict = {}
    for key, value, _ in messages:
        page = json.loads(key)["page"]
        if value is None:
            latest.pop(page, None)
        else:
            row = json.loads(value)
            latest[page] = [row["n"], row["amount"]]
    return [] if latest == expected else [f"Kafka sink: the compacted changelog {latest} differs from {expected}"]


def committed_records(topic: str, ends: dict[int, int]) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every committed record still in the topic below `ends`
    (partition -> offset), read_committed from the log start."""
    return [(m.partition(), m.offset(), m.value())
            for m in committed_messages({"bootstrap.servers": kafka_bootstrap()}, topic, below=ends)]


@dataclass
class Memory:
    """What the checker knows from before: the positions it last saw, and the committed records the
    retention scenarios read just before deleting them (they still count if the pipeline read them first)."""

    positions: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)  # (partition, offset) -> value, read before a deletion
    deleted_until: dict = field(default_factory=dict)  # partition -> the log start the suite set

    def remember(self, topic: str, ends: dict[int, int]) -> None:
        self.records.update({(p, o): v for p, o, v in committed_records(topic, ends)})


def watch_positions(pipeline: str, memory: Memory) -> tuple[dict, list[str]]:
    """The pipeline's positions now, and a violation for each that moved back since `memory` last saw it."""
    positions = {(t, p): o for t, p, o in sql(
        "SELECT topic, partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s", pipeline)}
    violations = [f"position of {key} moved back from {before} to {positions.get(key)}"
                  for key, before in memory.positions.items() if positions.get(key, 0) < before]
    memory.positions.update(positions)
    return positions, violations


def check(pipeline: str, topic: str, tables: dict[str, str], memory: Memory, codec: Codec) -> list[str]:
    """Every invariant of the module docstring; returns the violations."""
    positions, violations = watch_positions(pipeline, memory)
    # Records may be skipped as lost only where the suite deleted them (on_data_loss: skip).
    lost = sql("SELECT partition, lost_from, lost_until FROM kafka_batch.data_loss WHERE pipeline = %s", pipeline)
    for partition, lo, hi in lost:
        if hi > memory.deleted_until.get(partition, 0):
            violations.append(f"partition {partition}: {lo}..{hi} recorded as lost, but only offsets below"
                              f" {memory.deleted_until.get(partition, 0)} were deleted")
    valid, invalid = {}, set()
    ends = {p: o for (t, p), o in positions.items() if t == topic}
    records = {**memory.records, **{(p, o): v for p, o, v in committed_records(topic, ends)}}
    for (partition, offset), value in sorted(records.items()):
        if offset >= positions.get((topic, partition), 0) or any(
                p == partition and lo <= offset < hi for p, lo, hi in lost):
            continue
        try:
            record = codec.decode(value)
            valid[(partition, offset)] = (record["id"], record["page"], int(record["amount"]))
        except (ValueError, KeyError, TypeError):
            invalid.add((partition, offset))
    expected = defaultdict(lambda: [0, 0])
    for _, page, amount in valid.values():
        expected[page][0] += 1
        expected[page][1] += amount
    got = {page: [n, amount] for page, n, amount in sql(f"SELECT page, n, amount FROM {tables['aggregate']}")}
    if got != dict(expected):
        violations.append(f"aggregate differs: expected {dict(expected)}, found {got}")
    violations += check_published(topic, tables["kafka"], tables["kafka_shape"], valid, dict(expected))
    rows = {(p, o): (i, a) for p, o, i, a in sql(
        f"SELECT kafka_partition, kafka_offset, id, amount FROM {tables['rows']}")}
    if rows != {k: (v[0], v[2]) for k, v in valid.items()}:
        extra, missing = set(rows) - set(valid), set(valid) - set(rows)
        violations.append(f"rows differ: {len(extra)} not expected (e.g. {sorted(extra)[:3]}), {len(missing)} missing"
                          f" (e.g. {sorted(missing)[:3]})")
    latest: dict = {}
    for _, (record_id, _, amount) in sorted(valid.items()):  # in (partition, offset) order: the latest wins
        latest[upsert_key(record_id)] = None if amount <= UPSERT_DELETE_AT_MOST else (record_id, amount)
    expected_upsert = {k: v for k, v in latest.items() if v is not None}
    mirrored = {k: (i, a) for k, i, a in sql(f"SELECT bucket, id, amount FROM {tables['upsert']}")}
    if mirrored != expected_upsert:
        wrong = {k for k in set(mirrored) | set(expected_upsert) if mirrored.get(k) != expected_upsert.get(k)}
        violations.append(f"upsert differs on {len(wrong)} key(s), e.g. {sorted(wrong)[:3]}: expected"
                          f" {[expected_upsert.get(k) for k in sorted(wrong)[:3]]}, found {[mirrored.get(k) for k in sorted(wrong)[:3]]}")
    quarantined = {(p, o) for p, o in sql(
        'SELECT partition, "offset" FROM kafka_batch.quarantine WHERE pipeline = %s', pipeline)}
    if quarantined != invalid:
        violations.append(f"quarantine differs: {len(quarantined - invalid)} unexpected, {len(invalid - quarantined)}"
                          " invalid records not quarantined")
    chains = defaultdict(list)
    for partition, lo, hi in sql("SELECT partition, from_offset, until_offset FROM kafka_batch.live_ranges"
                                 " WHERE pipeline = %s ORDER BY partition, from_offset", pipeline):
        chains[partition].append((lo, hi))
    for (_, partition), position in positions.items():
        chain = chains.get(partition, [])
        if not chain:
            continue
        if chain[0][0] != 0 or chain[-1][1] != position or any(a[1] != b[0] for a, b in itertools.pairwise(chain)):
            violations.append(f"partition {partition}: live ranges {chain} do not chain from 0 to {position}")
    stuck = sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND state LIKE 'idle in transaction%%'", APP)[0][0]
    if stuck:
        violations.append(f"{stuck} session(s) left idle in transaction")
    return violations
