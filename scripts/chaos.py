"""`make chaos`: inject faults into real batches and check exactly-once against ground truth.

Every iteration produces traceable records (unique ids, integer amounts; transactions of two
transactional ids, each aborting a third of its own and committing the rest, as exactly-once producers
do; one transaction left open across the plan; a few invalid records), runs a batch through
`kafka-batch run` while a scenario strikes (SIGKILL of the job's process group in a chosen phase, among
them after the Kafka sink's transaction committed and before the Postgres one did, a
zombie left running while the run is retried, Postgres sessions terminated, two runs racing, a replay
racing a batch, Postgres or the broker restarted), lets the pipeline recover without faults, and then
checks, with a plain read_committed consumer that shares no code with the pipeline's reader:

  1. the aggregate, rows and upsert outputs equal what the committed records below the positions give
     (the upsert's: per key, the latest valid record by (partition, offset), deletes applied), and so
     does the Kafka sink's output topic, read read_committed: for JSON scenarios (shape rows) one
     message per valid record below the positions, each exactly once (a replay's marked as such); for
     Avro ones (the aggregate's changelog) the last message per page equals the expected totals;
  2. per partition, the live ledger ranges form one contiguous chain from the start to the position;
  3. no aborted record is counted, every invalid record is quarantined and none is counted;
  4. positions never move back (no reset is made here);
  5. after faults stop, lag reaches zero within a bound; no session is left idle in transaction.

A fault meant for a phase is injected only once the job is seen in that phase (from Postgres: the
attempt claimed, the commit transaction open, the batch committed); the table says how many landed.
A scenario named `<scenario>:avro` runs on a topic of Avro values in the Confluent wire format (the
local Schema Registry; the invalid records are then not in that format), checked the same way with
confluent-kafka's AvroDeserializer.

`--soak SECONDS` then runs everything at once: producers writing all along into a JSON and an Avro
topic, a pipeline on each (every sink) running batch after batch, and a fault every `--fault-every`
seconds (a run's process group killed, the pipeline's sessions terminated, a racing run, the broker
or Postgres restarted); then the producers stop, the pipelines catch up and the same checker runs.

    python scripts/chaos.py --iterations 3 --records 20000 [--scenarios kill-reading,race] [--json out.json]
    python scripts/chaos.py --scenarios '' --soak 300 --fault-every 15
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg2
import yaml
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tabulate import tabulate

from kafka_batch.errors import DataLossError
from kafka_batch_dev import local_stack
from kafka_batch_dev.committed import committed_messages

APP = "kafka_batch_chaos"  # application_name of every session the pipeline opens here
PAGES = ["/", "/a", "/b", "/c", "/d"]
RECOVERY_BOUND_S = 300
CLI = str(Path(sys.executable).parent / "kafka-batch")  # the pipeline's CLI, from this venv
TASK_TRIES = 4  # spark.task.maxFailures of the task-retry scenario (the master `local[2,4]`)


@dataclass
class Outcome:
    iterations: int = 0
    faults: Counter = field(default_factory=Counter)
    records: int = 0
    violations: list[str] = field(default_factory=list)
    worst_recovery_s: float = 0.0


# --- services ---------------------------------------------------------------------------------------

def kafka_bootstrap() -> str:
    return json.loads(os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"]


# The local home whose services the restarts stop and start (`--services-home`; default: `kafka-batch local`'s).
SERVICES_HOME: Path | None = None


def restart(service: str, kill: bool = False) -> None:
    local_stack.restart(service, SERVICES_HOME, kill=kill)


def broker_group() -> int:
    """The process group of the local Kafka node: the process listening on the bootstrap port."""
    port = int(kafka_bootstrap().rsplit(":", 1)[1])
    [pid] = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    return os.getpgid(pid)


def pg_params() -> dict:
    conn = json.loads(os.environ["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
    return {"host": conn["host"], "port": conn["port"], "user": conn.get("login"), "dbname": conn["schema"],
            **({"password": conn["password"]} if conn.get("password") else {})}


def sql(statement: str, *params) -> list[tuple]:
    conn = psycopg2.connect(**pg_params())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def chaos_environment() -> dict[str, str]:
    """The pipeline's sessions carry an application name, so faults can find them."""
    env = os.environ.copy()
    conn = json.loads(env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"])
    conn["extra"] = {**conn.get("extra", {}), "application_name": APP}
    env["AIRFLOW_CONN_KAFKA_BATCH_POSTGRES"] = json.dumps(conn)
    return env


def connect_environment(env: dict[str, str]) -> dict[str, str]:
    """The same pipelines, run on the local Spark Connect server: their `spark_default` points at it."""
    if "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT" not in env:
        raise SystemExit("--recover-on spark-connect needs the Spark Connect server: kafka-batch local up starts it")
    return {**env, "AIRFLOW_CONN_SPARK_DEFAULT": env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"]}


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


# --- running and striking -----------------------------------------------------------------------------

def start_run(pipeline: str, run_id: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([CLI, "run", "--pipeline", pipeline, "--run-id", run_id], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def batch_of(pipeline: str, run_id: str) -> tuple | None:
    rows = sql("SELECT id, status, attempt FROM kafka_batch.batches WHERE pipeline = %s AND run_id = %s",
               pipeline, run_id)
    return rows[0] if rows else None


class LockGate:
    """Holds a SHARE lock on one of the pipeline's tables: a session of the pipeline that writes it waits
    there, inside its transaction, so a fault lands in that moment for sure. On the aggregate table the
    commit waits with the positions already moved and the pipeline locked (a fast commit is otherwise
    hard to hit); on a staging table the executors' COPYs wait inside their tasks."""

    def __init__(self, table: str):
        self.table = table
        self.conn = psycopg2.connect(**pg_params())
        with self.conn.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN SHARE MODE")

    def waiting(self) -> set[int]:
        """Client ports of the pipeline's sessions waiting at the gate."""
        return {port for (port,) in sql(
            "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted"
            " AND l.relation = %s::regclass AND a.application_name = %s", self.table, APP)}

    def terminate_waiting(self) -> None:
        """End the sessions waiting at the gate (their transactions abort), and wait until they are gone."""
        sql("SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND l.relation = %s::regclass AND a.application_name = %s", self.table, APP)
        if not until(lambda: not self.waiting(), timeout=30):
            raise RuntimeError(f"sessions still wait at {self.table} after being terminated")

    def open(self) -> None:
        self.conn.rollback()
        self.conn.close()


def stage_gate(pipeline: str, run_id: str, proc: subprocess.Popen, timeout: float = 240) -> LockGate | None:
    """A gate on the rows sink's staging table of the run's attempt, as soon as the table exists (its
    retried task must replace, not add to, what a killed try wrote); None if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        batch = batch_of(pipeline, run_id)
        if batch is not None and batch[2] >= 1:
            table = f"kafka_batch_stage.b{batch[0]}_a{batch[2]}_rows"
            if sql("SELECT to_regclass(%s)", table)[0][0] is not None:
                return LockGate(table)
        time.sleep(0.01)
    return None


def in_commit(pipeline: str) -> bool:
    """A session of the pipeline holds an open transaction that writes positions or outputs."""
    return bool(sql("SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL"
                    " AND (query ILIKE '%%kafka_batch.offsets%%' OR query ILIKE 'INSERT INTO %%')", APP))


# A deferred trigger that makes the pipeline's Postgres COMMIT wait at a LockGate: at COMMIT, so after
# everything the commit transaction does, the Kafka sink's publish (its Kafka transaction) included.
_PUBLISHED_GATE = """
CREATE TABLE IF NOT EXISTS public.{gate} (at timestamptz DEFAULT now());
CREATE OR REPLACE FUNCTION public.{gate}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
  IF NEW.pipeline = '{pipeline}' AND NEW.status = 'committed' THEN
    INSERT INTO public.{gate} DEFAULT VALUES;
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER {gate} AFTER UPDATE ON kafka_batch.batches DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION public.{gate}();
"""


def published_gate(pipeline: str) -> LockGate:
    gate = f"{pipeline}_gate"
    conn = psycopg2.connect(**pg_params())
    with conn, conn.cursor() as cur:
        cur.execute(_PUBLISHED_GATE.format(gate=gate, pipeline=pipeline))
    conn.close()
    return LockGate(f"public.{gate}")


def wait_for(phase: str, pipeline: str, run_id: str, proc: subprocess.Popen, timeout: float = 240,
             gate: LockGate | None = None) -> bool:
    """Block until the run reaches `phase` (or ends); True if the fault can land in that phase."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        batch = batch_of(pipeline, run_id)
        if phase == "starting" and batch is not None:
            return True
        if phase == "reading" and batch is not None and batch[2] >= 1 and batch[1] in ("planned", "failed"):
            return True
        if phase == "commit" and (bool(gate.waiting()) if gate is not None else in_commit(pipeline)):
            return True
        if phase == "after-commit" and batch is not None and batch[1] == "committed":
            return True
        time.sleep(0.01 if phase == "commit" else 0.1)
    return False


def end_offsets(admin: AdminClient, topic: str, partitions, committed: bool = True) -> dict[int, int]:
    """Per partition, where a reader ends: the last stable offset (`committed`), else the high watermark."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                 isolation_level=level, request_timeout=30)
    return {tp.partition: f.result().offset for tp, f in futures.items()}


def open_transaction(admin: AdminClient, topic: str, partitions: list[int]) -> bool:
    """Some partition of the topic has a last stable offset below its end: a transaction is open on it."""
    stable, end = end_offsets(admin, topic, partitions), end_offsets(admin, topic, partitions, committed=False)
    return any(stable[p] < end[p] for p in partitions)


def stop_inside_publish(pipeline: str, run_id: str, tables: dict[str, str], proc: subprocess.Popen) -> bool:
    """The run's process group stopped while the Kafka sink's transaction is open on its topic (the
    two steps below: shape rows opened it in the read, so it is open at the commit already; a changelog
    opens it in the commit, after the gate); False if the run never got there, its group continuing."""
    return (stop_before_publish(pipeline, run_id, tables["aggregate"], proc)
            and step_into_transaction(tables["kafka"], proc))


def stop_before_publish(pipeline: str, run_id: str, aggregate: str, proc: subprocess.Popen) -> bool:
    """Stop the run's process group in its commit, before the publish (which comes last): held at a gate
    on the aggregate table, stopped, the gate opened. False if the run ended first."""
    gate = LockGate(aggregate)
    try:
        if not wait_for("commit", pipeline, run_id, proc, gate=gate):
            return False
        os.killpg(proc.pid, signal.SIGSTOP)
        return True
    finally:
        gate.open()


def step_into_transaction(output: str, proc: subprocess.Popen, slice_s: float = 0.001, timeout: float = 120) -> bool:
    """The stopped group and the broker take turns: the group runs for `slice_s` while the broker is
    stopped, then the broker runs (the group stopped) and answers what the group sent, and the output topic
    is asked whether the Kafka sink's transaction is open on it. A transaction's records are appended in a
    broker's turn and its commit can be asked for only in a later turn of the group (after their
    acknowledgements), so an open transaction is seen however short it is. True: open, the group stopped;
    False: the run ended without one, the group continuing."""
    opened = False
    try:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
        partitions = sorted(admin.list_topics(output, timeout=30).topics[output].partitions)
        broker = broker_group()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if open_transaction(admin, output, partitions):
                opened = True
                return True
            os.killpg(broker, signal.SIGSTOP)
            try:
                os.killpg(proc.pid, signal.SIGCONT)
                time.sleep(slice_s)
                os.killpg(proc.pid, signal.SIGSTOP)
            finally:
                os.killpg(broker, signal.SIGCONT)
            time.sleep(0.005)  # the broker's turn: it answers what the group sent before it is asked
    except ProcessLookupError:  # it ended during its turn
        pass
    finally:
        if not opened:
            resume(proc)  # never left stopped, whatever went wrong here
    return False


def resume(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def terminate_sessions() -> int:
    return len(sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", APP))


def python_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The run's Python workers: the processes pyspark's daemon forks for tasks (not the daemon)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    workers = []
    for child in family:
        try:
            if "pyspark.daemon" in " ".join(child.cmdline()) and "pyspark.daemon" in " ".join(child.parent().cmdline()):
                workers.append(child)
        except (psutil.NoSuchProcess, AttributeError):  # gone, or its parent is
            continue
    return workers


def tasks_running(proc: subprocess.Popen, timeout: float = 120) -> list[psutil.Process]:
    """Wait until the run's Spark tasks run (its Python workers exist); [] if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        workers = python_workers(proc)
        if workers:
            return workers
        time.sleep(0.02)
    return []


def kill_a_task(proc: subprocess.Popen, rng: random.Random) -> bool:
    """SIGKILL one Python worker once the run has them: the task it runs fails and Spark retries it."""
    while workers := tasks_running(proc):
        time.sleep(rng.uniform(0, 0.5))
        try:
            rng.choice(workers).kill()
            return True
        except psutil.NoSuchProcess:
            continue
    return False


def kill_a_staging_task(proc: subprocess.Popen, gate: LockGate, timeout: float = 120) -> bool:
    """SIGKILL the Python worker whose COPY waits at the gate (found by its session's client port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        ports = gate.waiting()
        for worker in python_workers(proc) if ports else []:
            try:
                if any(c.laddr and c.laddr.port in ports for c in worker.net_connections(kind="tcp")):
                    worker.kill()
                    return True
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.02)
    return False


def lost_tasks(log_dir: Path) -> int:
    """Task failures Spark reports in the run's log (each one retried, up to the master's limit)."""
    return sum(log.read_text(errors="replace").count("Lost task") for log in log_dir.glob("*.log"))


def delete_in_plan(pipeline: str, topic: str, run_id: str, rng: random.Random, memory: Memory) -> bool:
    """Retention overtakes the batch's plan: delete a random prefix of one of its planned ranges,
    after reading (independently) what is about to go."""
    planned = sql("SELECT r.partition, r.from_offset, r.until_offset FROM kafka_batch.batch_ranges r"
                  " JOIN kafka_batch.batches b ON b.id = r.batch_id WHERE b.pipeline = %s AND b.run_id = %s",
                  pipeline, run_id)
    if not planned:
        return False
    partition, lo, hi = rng.choice(planned)
    cut = rng.randint(lo + 1, hi)
    memory.remember(topic, {partition: cut})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
    for future in admin.delete_records([TopicPartition(topic, partition, cut)]).values():
        future.result()
    memory.deleted_until[partition] = max(cut, memory.deleted_until.get(partition, 0))
    return True


def set_data_loss_policy(path: Path, policy: str) -> None:
    """What an operator does to accept a loss (`skip`) and to go back to refusing one (`fail`)."""
    definition = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**definition, "on_data_loss": policy}, sort_keys=False))


def scenario(name: str, pipeline: str, topic: str, run_id: str, env: dict, rng: random.Random,
             tables: dict[str, str], memory: Memory, definition: Path) -> Counter:
    """Strike once; returns what landed, by phase."""
    landed: Counter = Counter()
    if name == "kill-published":  # the Kafka sink's transaction committed, the Postgres one not yet
        gate = published_gate(pipeline)
        try:
            proc = start_run(pipeline, run_id, env)
            if wait_for("commit", pipeline, run_id, proc, gate=gate):
                kill_group(proc)
                # Its COMMIT is in Postgres already, waiting at the gate: it would go on once the gate opens
                # (a backend does not notice its client is gone). Ending the session aborts it.
                gate.terminate_waiting()
                landed["published"] += 1
        finally:
            gate.open()
            sql(f"DROP TRIGGER {gate.table.split('.')[1]} ON kafka_batch.batches")
        proc.wait()
    elif name == "kill-producing":  # SIGKILL inside the Kafka sink's transaction, its messages produced
        proc = start_run(pipeline, run_id, env)
        if stop_inside_publish(pipeline, run_id, tables, proc):
            kill_group(proc)
            landed["producing"] += 1
        proc.wait()
    elif name.startswith("kill-"):
        phase = name.removeprefix("kill-")
        gate = LockGate(tables["aggregate"]) if phase == "commit" else None
        try:
            proc = start_run(pipeline, run_id, env)
            if wait_for(phase, pipeline, run_id, proc, gate=gate):
                kill_group(proc)
                landed[phase] += 1
        finally:
            if gate is not None:
                gate.open()
        proc.wait()
    elif name == "zombie":  # the Airflow task dies, its spark-submit lives on; the task is retried
        proc = start_run(pipeline, run_id, env)
        if wait_for("reading", pipeline, run_id, proc):
            os.kill(proc.pid, signal.SIGKILL)  # the CLI only; spark-submit and the JVM run on
            landed["zombie"] += 1
            retry = start_run(pipeline, run_id, env)
            retry.wait()
        time.sleep(2)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the zombie is left
        except ProcessLookupError:
            pass
    elif name.startswith("terminate-"):
        phase = name.removeprefix("terminate-")
        proc = start_run(pipeline, run_id, env)
        if phase == "random":  # a random moment at which the pipeline has a session to lose
            time.sleep(rng.uniform(0, 20))
            while proc.poll() is None:
                if terminate_sessions():
                    landed["random"] += 1
                    break
                time.sleep(0.05)
        else:
            gate = LockGate(tables["aggregate"])
            try:
                if wait_for("commit", pipeline, run_id, proc, gate=gate) and terminate_sessions():
                    landed["commit"] += 1
            finally:
                gate.open()
        proc.wait()
    elif name == "race":
        runs = [start_run(pipeline, f"{run_id}-{n}", env) for n in range(2)]
        for proc in runs:
            proc.wait()
        landed["race"] += 1
    elif name == "replay-race":
        replay = subprocess.Popen([CLI, "replay", "--pipeline", pipeline, "--topic", topic, "--from", "0",
                                   "--until", "1000000000", "--run-id", f"{run_id}-replay"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        proc = start_run(pipeline, run_id, env)
        replay.wait()
        proc.wait()
        landed["replay-race"] += 1
    elif name == "pg-restart":
        proc = start_run(pipeline, run_id, env)
        if wait_for("reading", pipeline, run_id, proc):
            restart("postgres")
            landed["reading"] += 1
        proc.wait()
    elif name in ("broker-restart", "broker-kill"):  # between batches: stopped cleanly, or SIGKILLed
        restart("kafka", kill=name == "broker-kill")
        landed["between"] += 1
    elif name == "broker-kill-reading":  # the node SIGKILLed while the batch's tasks read from it
        proc = start_run(pipeline, run_id, env)
        if wait_for("reading", pipeline, run_id, proc):
            restart("kafka", kill=True)
            landed["reading"] += 1
        proc.wait()
    elif name == "broker-kill-publishing":  # the node SIGKILLed while the Kafka sink's transaction is open
        proc = start_run(pipeline, run_id, env)
        if stop_inside_publish(pipeline, run_id, tables, proc):
            try:
                restart("kafka", kill=True)
                landed["publishing"] += 1
            finally:
                resume(proc)
        proc.wait()
    elif name == "broker-kill-published":  # the Kafka sink's transaction committed, the Postgres one not yet
        gate = published_gate(pipeline)
        try:
            proc = start_run(pipeline, run_id, env)
            if wait_for("commit", pipeline, run_id, proc, gate=gate):
                restart("kafka", kill=True)
                landed["published"] += 1
        finally:
            gate.open()
            sql(f"DROP TRIGGER {gate.table.split('.')[1]} ON kafka_batch.batches")
        proc.wait()
    elif name == "task-retry":  # a Python worker dies mid-task; Spark retries the task (local[2,4])
        phase = rng.choice(["reading", "staging"])  # a read task, or a task COPYing the rows sink's stage
        log_dir = Path(tempfile.mkdtemp(prefix="kafka_batch_chaos_logs_"))
        retrying = {**env, "KAFKA_BATCH_LOG_DIR": str(log_dir), "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {"conn_type": "spark", "host": f"local[2,{TASK_TRIES}]"})}
        proc = start_run(pipeline, run_id, retrying)
        if phase == "reading":
            killed = wait_for("reading", pipeline, run_id, proc) and kill_a_task(proc, rng)
        else:
            gate = stage_gate(pipeline, run_id, proc)
            try:
                killed = gate is not None and kill_a_staging_task(proc, gate)
            finally:
                if gate is not None:
                    gate.open()
        proc.wait()
        batch = batch_of(pipeline, run_id)
        if killed and lost_tasks(log_dir):  # landed in a task, and that attempt went on
            landed[phase if batch and batch[1:] == ("committed", 1) else f"{phase}, batch retried"] += 1
        shutil.rmtree(log_dir, ignore_errors=True)
    elif name.startswith("retention-"):  # on_data_loss is the suffix (the pipeline's setting)
        phase = rng.choice(["planned", "reading"])  # after the plan, or while Spark's tasks read
        proc = start_run(pipeline, run_id, env)
        struck = wait_for("starting", pipeline, run_id, proc) and (phase == "planned" or bool(tasks_running(proc)))
        if struck and delete_in_plan(pipeline, topic, run_id, rng, memory):
            landed[phase] += 1
        if proc.wait() == DataLossError.exit_code and name == "retention-fail":
            # Refused, nothing changed; the operator accepts the loss for one run, then refuses again.
            set_data_loss_policy(definition, "skip")
            subprocess.run([CLI, "run", "--pipeline", pipeline],
                           env=env, capture_output=True)
            set_data_loss_policy(definition, "fail")
            landed["refused, then accepted"] += 1
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    return landed


def lag(pipeline: str, topic: str) -> int:
    """Last stable offsets (asked here, not through the pipeline's code) minus the stored positions."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
    ends = end_offsets(admin, topic, admin.list_topics(topic, timeout=30).topics[topic].partitions)
    positions = {p: o for p, o in sql("SELECT partition, next_offset FROM kafka_batch.offsets WHERE pipeline = %s",
                                      pipeline)}
    return sum(end - positions.get(p, 0) for p, end in ends.items())


def recover(pipeline: str, topic: str, env: dict) -> float:
    """Runs without faults until the lag is zero; returns how long it took."""
    started = time.monotonic()
    while time.monotonic() - started < RECOVERY_BOUND_S:
        if lag(pipeline, topic) == 0:
            return time.monotonic() - started
        subprocess.run([CLI, "run", "--pipeline", pipeline], env=env, capture_output=True)
    return float("inf")


SCENARIOS = ["kill-starting", "kill-reading", "kill-commit", "kill-producing", "kill-published", "kill-after-commit",
             "zombie", "terminate-random", "terminate-commit", "race", "replay-race", "pg-restart", "broker-restart",
             "broker-kill", "task-retry", "retention-skip", "retention-fail", "kill-reading:avro", "broker-kill-reading",
             "broker-kill-publishing", "broker-kill-published"]


# --- the soak: everything at once, for minutes ---------------------------------------------------------

SOAK_FAULTS = ("kill-run", "terminate-sessions", "race", "broker-restart", "broker-kill", "pg-restart")
RESTARTED = {"broker-restart": "kafka", "broker-kill": "kafka", "pg-restart": "postgres"}  # the service each restarts


class SoakProducer(threading.Thread):
    """Writes all along: transactions of two transactional ids, each aborting a third of its own and
    committing the rest, now and then one held open for seconds (across a batch's plan). When the broker
    restarts under it, new producers take the same ids (fencing the old ones, whose open transaction the
    broker then aborts)."""

    def __init__(self, topic: str, partitions: int, codec: Codec, seed: int, stop: threading.Event):
        super().__init__(daemon=True, name=f"produce {topic}")
        self.topic, self.partitions, self.codec, self.stop = topic, partitions, codec, stop
        self.rng = random.Random(seed)
        self.records = self.errors = 0

    def run(self) -> None:
        producers = None
        while not self.stop.is_set():
            try:
                producers = producers or transactional_producers(self.topic)
                producer = self.rng.choice(producers)
                size = self.rng.randint(20, 200)
                write_transaction(producer, self.topic, self.partitions, size, self.rng, self.codec)
                if self.rng.random() < 0.1:
                    self.stop.wait(self.rng.uniform(1, 5))
                producer.abort_transaction(30) if self.rng.random() < 1 / 3 else producer.commit_transaction(30)
                self.records += size
                self.stop.wait(self.rng.uniform(0.05, 0.3))
            except KafkaException:
                self.errors += 1
                producers = None
                self.stop.wait(1)


class SoakRunner(threading.Thread):
    """Runs the pipeline's batches one after the other until told to stop."""

    def __init__(self, pipeline: str, env: dict, stop: threading.Event):
        super().__init__(daemon=True, name=f"run {pipeline}")
        self.pipeline, self.env, self.stop = pipeline, env, stop
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def running(self) -> subprocess.Popen | None:
        """The run in progress, if any."""
        proc = self.proc
        return proc if proc is not None and proc.poll() is None else None

    def run(self) -> None:
        while not self.stop.is_set():
            self.proc = start_run(self.pipeline, f"soak-{self.runs}", self.env)
            self.proc.wait()
            self.runs += 1


def until(found, timeout: float = 10.0):
    """What `found()` returns once it is truthy, polled for up to `timeout` seconds (else its last answer)."""
    deadline = time.monotonic() + timeout
    while not (answer := found()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


def soak(seconds: float, every: float, partitions: int, rng: random.Random, env: dict,
         pipelines_dir: Path) -> dict[str, Outcome]:
    """Producers write all the time, a pipeline per format (JSON, Avro; every sink each) runs batch after
    batch, and every `every` seconds a fault strikes (the faults in turn, each target at random); then
    the producers stop, the pipelines catch up without faults and the checker runs."""
    stop = threading.Event()
    pipelines = {}
    for encoding in ("json", "avro"):
        name = f"chaos_soak_{encoding}_{uuid.uuid4().hex[:6]}"
        topic, tables, path = create_pipeline(name, encoding, partitions, pipelines_dir)
        codec = Codec(topic, encoding == "avro")
        pipelines[f"soak:{encoding}"] = (name, topic, tables, path, codec, Memory(),
                                         SoakProducer(topic, partitions, codec, rng.randrange(2**32), stop),
                                         SoakRunner(name, env, stop))
    results = {key: Outcome(iterations=1) for key in pipelines}
    for *_, producer, runner in pipelines.values():
        producer.start()
        runner.start()
    racing: list[subprocess.Popen] = []
    started = time.monotonic()
    faults = list(SOAK_FAULTS)
    for n in itertools.count():
        time.sleep(max(0.0, started + (n + 1) * every - time.monotonic()))
        if time.monotonic() - started >= seconds:
            break
        fault, key = faults[n % len(faults)], rng.choice(sorted(pipelines))
        if n % len(faults) == len(faults) - 1:
            rng.shuffle(faults)
        name, *_, memory, _, runner = pipelines[key]
        for other, (other_name, *_, other_memory, _, _) in pipelines.items():
            results[other].violations += watch_positions(other_name, other_memory)[1]
        landed = {key}
        if fault == "kill-run":  # at a random moment of a running batch (the runner starts the next at once)
            time.sleep(rng.uniform(0, 3))
            proc = until(runner.running)
            if proc is None:
                landed = set()
            else:
                kill_group(proc)
        elif fault == "terminate-sessions":  # once the pipelines have a session to lose
            landed = set(pipelines) if until(terminate_sessions) else set()
        elif fault == "race":
            racing.append(start_run(name, f"soak-race-{n}", env))
        else:
            restart(RESTARTED[fault], kill=fault == "broker-kill")
            landed = set(pipelines)
        for hit in landed:
            results[hit].faults[fault] += 1
        target = "missed" if not landed else key if landed == {key} else "all"
        print(f"soak {time.monotonic() - started:.0f}s: {fault} on {target} (load {os.getloadavg()[0]:.1f})", flush=True)
    stop.set()
    for *_, producer, runner in pipelines.values():
        producer.join(120)
        runner.join(600)
    for proc in racing:
        proc.wait()
    for key, (name, topic, tables, path, codec, memory, producer, runner) in pipelines.items():
        outcome = results[key]
        outcome.records = producer.records
        took = recover(name, topic, env)
        outcome.worst_recovery_s = took
        if took == float("inf"):
            outcome.violations.append(f"lag not zero within {RECOVERY_BOUND_S}s")
        outcome.violations += check(name, topic, tables, memory, codec)
        print(f"{key}: {runner.runs} runs, {producer.records} records produced ({producer.errors} producer errors"
              f" recovered), faults {dict(outcome.faults)}, violations {len(outcome.violations)}", flush=True)
        path.unlink(missing_ok=True)
    return results


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2, help="per scenario")
    parser.add_argument("--records", type=int, default=20_000, help="produced per iteration")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    parser.add_argument("--soak", type=float, default=0, metavar="SECONDS",
                        help="after the scenarios: producers, batches and faults all at once for this long")
    parser.add_argument("--fault-every", type=float, default=15, metavar="SECONDS", help="in the soak")
    parser.add_argument("--recover-on", choices=["spark-submit", "spark-connect"], default="spark-submit",
                        help="how the fault-free runs after a strike reach Spark (spark-connect: the server of "
                        "`kafka-batch local up`; strikes always go through spark-submit)")
    parser.add_argument("--services-home", type=Path, help="the local home whose Kafka node and Postgres the restarts"
                        " stop and start (default: `kafka-batch local`'s)")
    args = parser.parse_args(argv)
    global SERVICES_HOME
    SERVICES_HOME = args.services_home
    rng = random.Random(args.seed)
    env = chaos_environment()
    from kafka_batch.core import database  # setup only: the schema exists before the first fault

    conn = psycopg2.connect(**pg_params())
    database.apply_migrations(conn)
    conn.close()
    # The suite's pipelines live in a directory of their own, never among the project's pipelines.
    pipelines_dir = Path(tempfile.mkdtemp(prefix="kafka_batch_chaos_pipelines_"))
    env["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines_dir)
    recovery_env = env if args.recover_on == "spark-submit" else connect_environment(env)
    results = {}
    for name in filter(None, args.scenarios.split(",")):
        outcome = results[name] = Outcome()
        strike, _, encoding = name.partition(":")
        pipeline = f"chaos_{strike.replace('-', '_')}{'_' + encoding if encoding else ''}_{uuid.uuid4().hex[:6]}"
        topic, tables, path = create_pipeline(pipeline, encoding, args.partitions, pipelines_dir,
                                              strike.removeprefix("retention-") if strike.startswith("retention-")
                                              else None)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
        memory = Memory()
        codec = Codec(topic, encoding == "avro")
        try:
            for iteration in range(args.iterations):
                started = time.monotonic()
                late = produce(topic, args.partitions, args.records, rng, open_txn=iteration % 2 == 0, codec=codec)
                produced = time.monotonic()
                outcome.records += args.records
                outcome.faults += scenario(strike, pipeline, topic, f"it{iteration}", env, rng, tables, memory, path)
                struck = time.monotonic()
                if late is not None:
                    commit_late(late)
                took = recover(pipeline, topic, recovery_env)
                outcome.worst_recovery_s = max(outcome.worst_recovery_s, took)
                if took == float("inf"):
                    outcome.violations.append(f"iteration {iteration}: lag not zero within {RECOVERY_BOUND_S}s")
                checking = time.monotonic()
                outcome.violations += [f"iteration {iteration}: {v}"
                                       for v in check(pipeline, topic, tables, memory, codec)]
                outcome.iterations += 1
                print(f"{name} iteration {iteration}: faults {dict(outcome.faults)}, "
                      f"violations {len(outcome.violations)}, recovery {took:.0f}s (produce {produced - started:.0f}s,"
                      f" strike {struck - produced:.0f}s, check {time.monotonic() - checking:.0f}s,"
                      f" load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            path.unlink(missing_ok=True)
            if not outcome.violations:  # topics with a violation stay, to be looked into
                for done in (topic, tables["kafka"]):
                    admin.delete_topics([done], operation_timeout=60)[done].result()
    if args.soak:
        results.update(soak(args.soak, args.fault_every, args.partitions, rng, recovery_env, pipelines_dir))
    shutil.rmtree(pipelines_dir, ignore_errors=True)
    rows = [(name, o.iterations, ", ".join(f"{k}: {v}" for k, v in sorted(o.faults.items())) or "0",
             o.records, len(o.violations), f"{o.worst_recovery_s:.0f}") for name, o in results.items()]
    print(tabulate(rows, headers=["scenario", "iterations", "faults landed", "records", "violations",
                                  "worst recovery s"]))
    for name, o in results.items():
        for violation in o.violations:
            print(f"VIOLATION {name}: {violation}")
    if args.json:
        args.json.write_text(json.dumps({name: {"iterations": o.iterations, "faults": dict(o.faults),
                                                "records": o.records, "violations": o.violations,
                                                "worst_recovery_s": o.worst_recovery_s}
                                         for name, o in results.items()}, indent=2))
    return 1 if any(o.violations for o in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
