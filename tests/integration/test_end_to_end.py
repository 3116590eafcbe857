"""The exactly-once claim, end to end through the CLI: Spark reads the ranges, Postgres commits (DAG runs
through Airflow: tests/airflow).

Results are compared with ground truth read straight from the topic (tests/integration/helpers.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch.spark import jvm_archive
from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    ROWS_SINK,
    admin_client,
    aggregate_table,
    batches_of,
    ground_truth,
    kafka_config,
    merged,
    new_pipeline,
    positions,
    query,
    records_by_partition,
    rows_contents,
    rows_truth,
    run_cli,
    sink_table,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration
# The page-views aggregation for a definition whose duration_ms arrives as a string.
DURATION_AS_TEXT_AGGREGATE = {
    "group_by": {"page": {"expr": "page", "type": "text"},
                 "minute": {"expr": "date_trunc('minute', timestamp)", "type": "timestamptz"}},
    "measures": {"views": {"expr": "1", "type": "bigint"},
                 "total_duration_ms": {"expr": "cast(duration_ms as bigint)", "type": "bigint"}},
}


def _class_archives(directory: Path, timeout: float = 120.0) -> list[Path]:
    """The JVM class archives in `directory` once no spark-submit is writing one (each writer holds its
    archive's lock file until the archive is in place)."""
    deadline = time.monotonic() + timeout
    for lock in directory.glob("*.lock"):
        with open(lock) as held:
            while True:
                try:
                    fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"{lock} still held after {timeout:.0f}s"
                    time.sleep(0.5)
    return list(directory.glob("*.jsa"))


def test_rerun_of_a_committed_batch_changes_nothing(services):
    pipeline = new_pipeline("rerun", spark_submit=True)
    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 1200, seed=7)
    result = run_cli("run", "--pipeline", pipeline.name, "--run-id", "first")
    # Quiet by default: the job's own lines and a summary table on the terminal, spark-submit's log in a file.
    [log_line] = [line for line in result.stdout.splitlines() if line.startswith("Spark's log: ")]
    assert "INFO SparkContext" in Path(log_line.split()[2]).read_text()
    assert "SparkContext" not in result.stdout + result.stderr
    # After a spark-submit that succeeded, the JVM's class archive is in place for the next ones (this run's,
    # or, when another test's spark-submit was writing it as this one started, that writer's).
    assert _class_archives(Path(os.environ[jvm_archive.ENV]))
    assert re.search(r"\n  batch \d+: reading 3 range\(s\) \(\d+ after splitting\) in \d+ Spark task", result.stdout)
    before_table, before_positions = table_contents(pipeline), positions(pipeline.name)
    assert sum(v for v, _ in before_table.values()) == 1200

    sample_data.produce_page_views(kafka_config(), pipeline.topics[0], 300, seed=8)
    # Same run id: the persisted (committed) batch comes back, Spark is not started, nothing moves.
    again = run_cli("run", "--pipeline", pipeline.name, "--run-id", "first")
    assert "committed" in again.stdout
    # The Spark job itself, handed the committed batch, is a no-op success too, even from a process that
    # has just executed another pipeline's batch through Spark Connect (pyspark marks such a process). A
    # process of its own: this one may hold the `spark` fixture's session, and Connect refuses to start then.
    other = new_pipeline("rerunconnect", partitions=1)
    sample_data.produce_page_views(kafka_config(), other.topics[0], 100, seed=9)
    run_cli("plan", "--pipeline", other.name)
    script = ("import sys\nfrom kafka_batch.cli.commands import submit_batch\nfrom kafka_batch.config import load_pipeline\n"
              "for name, batch in zip(sys.argv[1::2], sys.argv[2::2]):\n"
              "    submit_batch(load_pipeline(name), int(batch))\n")
    child = subprocess.run([sys.executable, "-c", script, other.name, str(batches_of(other.name)[0][0]),
                            pipeline.name, str(batches_of(pipeline.name)[0][0])], capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    assert table_contents(other) == ground_truth(other.topics[0])
    assert table_contents(pipeline) == before_table
    assert positions(pipeline.name) == before_positions
    assert len(batches_of(pipeline.name)) == 1


def _produce(topic: str, values: list[bytes], partition: int = 0) -> list[int]:
    """Produce raw values to one partition; returns their offsets."""
    from confluent_kafka import Producer

    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    for value in values:
        producer.produce(topic, key="u", value=value, partition=partition,
                         on_delivery=lambda err, msg: offsets.append(msg.offset()))
    producer.flush(30)
    return sorted(offsets)


MISTYPED = b'{"user_id": "u", "page": "/x", "duration_ms": "12"}'


def test_under_fail_an_invalid_record_fails_the_batch_and_commits_nothing(services):
    pipeline = new_pipeline("badrec", partitions=1, on_invalid_record="fail")
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 50, seed=1)
    _produce(topic, [MISTYPED])
    sample_data.produce_page_views(kafka_config(), topic, 10, seed=2)

    result = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert result.returncode == 2  # invalid input: retrying cannot help
    assert result.stderr.strip().splitlines()[-1].startswith("kafka-batch: invalid input: batch ")
    assert "Traceback" not in result.stderr
    [(batch_id, _, status, _, records, error)] = batches_of(pipeline.name)
    assert status == "failed"
    assert f"invalid record {topic}[0] at offset 50" in error
    assert "duration_ms" in error
    assert positions(pipeline.name) == {(topic, 0): 0}  # where it begins; nothing committed
    assert table_contents(pipeline) == {}


def test_invalid_records_are_quarantined_and_a_replay_reprocesses_them(services):
    pipeline = new_pipeline("poison", partitions=1, rows=True)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 50, seed=1)
    mistyped, garbage = _produce(topic, [MISTYPED, b"\xff not json"])
    sample_data.produce_page_views(kafka_config(), topic, 10, seed=2)
    poison = {mistyped, garbage}
    clean = lambda p, o: o not in poison  # noqa: E731

    result = run_cli("run", "--pipeline", pipeline.name)
    assert "2 quarantined" in result.stdout
    # Under Spark Connect the job runs in the CLI: its lines on the terminal and in the log file.
    [log_line] = [line for line in result.stdout.splitlines() if line.startswith("Spark's log: ")]
    assert "INFO kafka_batch.job: batch " in Path(log_line.split()[2]).read_text()
    assert re.search(r"\n  batch \d+: reading 1 range\(s\) \(\d+ after splitting\) in \d+ Spark task", result.stdout)
    assert [topic, "0", "0", "62", "60", "0", "2"] in [line.split() for line in result.stdout.splitlines()]
    assert re.search(r"batch \d+ committed: 60 records in \d+ s \([\d,]+ records/s\), 2 quarantined", result.stdout)
    batches = json.loads(run_cli("batches", "--pipeline", pipeline.name, "--last", "5", "--json").stdout)
    assert [(b["status"], b["records_read"], b["records_invalid"]) for b in batches["batches"]] == [("committed", 60, 2)]
    assert table_contents(pipeline) == ground_truth(topic, select=clean)
    assert rows_contents(pipeline) == rows_truth(topic, select=clean)
    assert positions(pipeline.name) == {(topic, 0): 62}  # the clean records after them committed too
    status = run_cli("status", "--pipeline", pipeline.name).stdout.splitlines()
    assert status[0].split() == ["topic", "partitions", "lag", "behind", "most", "behind", "(lag)", "last", "batch"]
    assert status[2].split()[:5] == [topic, "1", "0", "0", "-"]
    assert status[4].split() == ["topic", "partition", "position", "last", "stable", "lag", "last", "batch"]
    assert status[6].split()[:5] == [topic, "0", "62", "62", "0"]
    quarantined = query('SELECT "offset", value_bytes, reason FROM kafka_batch.quarantine WHERE pipeline = %s'
                        ' ORDER BY 1', pipeline.name)
    assert [(o, n) for o, n, _ in quarantined] == [(mistyped, len(MISTYPED)), (garbage, len(b"\xff not json"))]
    assert all("mistyped: " in reason for *_, reason in quarantined)
    listed = run_cli("quarantine", "--pipeline", pipeline.name).stdout
    assert f"--from {mistyped}" in listed and str(garbage) in listed

    # The operator fixes the definition (duration_ms arrives as a string) and replays the range.
    sinks = {"aggregate": {**DURATION_AS_TEXT_AGGREGATE, "table": aggregate_table(pipeline)},
             "rows": {**ROWS_SINK, "table": sink_table(pipeline, "rows"),
                      "columns": {**ROWS_SINK["columns"], "duration_ms": {"expr": "cast(duration_ms as bigint)",
                                                                          "type": "bigint"}}}}
    update_pipeline(pipeline.name, record={"fields": {"user_id": "string", "page": "string", "duration_ms": "string"}},
                    sinks=sinks)
    run_cli("replay", "--pipeline", pipeline.name, "--topic", topic, "--from", str(mistyped), "--until",
            str(mistyped + 1))
    assert query('SELECT "offset" FROM kafka_batch.quarantine WHERE pipeline = %s', pipeline.name) == [(garbage,)]
    [(_, timestamp_ms)] = [r for r in records_by_partition(topic)[0] if r[0] == mistyped]
    minute = datetime.fromtimestamp(timestamp_ms // 60_000 * 60, tz=UTC)
    assert table_contents(pipeline) == merged(ground_truth(topic, select=clean), {("/x", minute): (1, 12)})
    assert rows_contents(pipeline)[(topic, 0, mistyped)][:3] == ("u", "/x", 12)
    assert len(rows_contents(pipeline)) == 61


def test_fields_parsed_in_the_reader_and_by_spark_give_the_ground_truth(services):
    """One batch with chunks the reader parses (pyarrow), tombstones among them, and a chunk it
    leaves to from_json (an invalid record in it): the sinks hold what the topic says."""
    pipeline = new_pipeline("parsed", partitions=3, rows=True)
    topic = pipeline.topics[0]
    rng = random.Random(7)
    views = [json.dumps(sample_data.page_view(rng)[1]).encode() for _ in range(300)]
    _produce(topic, views[:100], partition=0)
    _produce(topic, [None if i % 7 == 3 else v for i, v in enumerate(views[100:200])], partition=1)
    mistyped = _produce(topic, [*views[200:250], MISTYPED, *views[250:]], partition=2)[50]
    clean = lambda p, o: (p, o) != (2, mistyped)  # noqa: E731

    assert "1 quarantined" in run_cli("run", "--pipeline", pipeline.name).stdout
    assert table_contents(pipeline) == ground_truth(topic, select=clean)
    assert rows_contents(pipeline) == rows_truth(topic, select=clean)
    assert query('SELECT partition, "offset" FROM kafka_batch.quarantine WHERE pipeline = %s', pipeline.name) == [
        (2, mistyped)]


def test_too_many_invalid_records_fail_the_batch_naming_the_first(services):
    pipeline = new_pipeline("schema", partitions=1, limits={"max_invalid_ratio": 0.1})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 5, seed=1)
    first, *_ = _produce(topic, [MISTYPED] * 5)
    result = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "5 of 10 records are invalid (50.0%, over max_invalid_ratio 0.1)" in result.stderr
    assert f"{topic}[0] at offset {first}: not a JSON object" in result.stderr
    assert positions(pipeline.name) == {(topic, 0): 0}
    assert query("SELECT count(*) FROM kafka_batch.quarantine WHERE pipeline = %s", pipeline.name) == [(0,)]


def _transactional_page_views(topic: str, transactions: int, size: int, seed: int) -> Producer:
    """Transactions of two producers, interleaved, each committing two in three of its own and aborting
    the third (one transactional id commits and aborts, as exactly-once producers do); returns the first."""
    rng = random.Random(seed)
    bootstrap = kafka_config()["bootstrap.servers"]
    producers = [Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-{n}"}) for n in range(2)]
    for producer in producers:
        producer.init_transactions(30)
    for n in range(transactions):
        producer = producers[n % 2]
        producer.begin_transaction()
        for _ in range(size):
            key, value = sample_data.page_view(rng)
            producer.produce(topic, key=key, value=json.dumps(value))
        producer.flush(30)
        producer.abort_transaction() if n // 2 % 3 == 2 else producer.commit_transaction()
    return producers[0]


def _committed_offsets(pipeline_name: str) -> int:
    return sum(positions(pipeline_name).values())


def test_transactions_splits_and_limits_give_the_ground_truth(services):
    """Aborted records never count, an open transaction waits for its commit, split and capped runs agree."""
    whole = new_pipeline("whole", partitions=2)
    topic = whole.topics[0]
    split = new_pipeline("split", partitions=0, topics=[topic], limits={"max_records_per_task": 23, "min_tasks": 6})
    capped = new_pipeline("capped", partitions=0, topics=[topic], limits={"max_records_per_batch": 600})
    producer = _transactional_page_views(topic, transactions=30, size=30, seed=11)
    producer.begin_transaction()  # open at plan time: its records belong to a later batch
    for _ in range(20):
        producer.produce(topic, key="late", value=json.dumps({"user_id": "late", "page": "/late", "duration_ms": 1}))
    producer.flush(30)
    last_stable = KafkaOffsets(kafka_config()).offsets([(topic, 0), (topic, 1)])

    for pipeline in (whole, split, capped):
        run_cli("run", "--pipeline", pipeline.name)
    truth = ground_truth(topic)
    assert sum(v for v, _ in truth.values()) == 600  # 20 committed transactions of 30
    assert table_contents(whole) == truth
    assert table_contents(split) == truth
    assert positions(whole.name) == {(topic, p): o.last_stable for (_, p), o in last_stable.items()}
    assert _committed_offsets(capped.name) == 600  # the cap counts offsets; the rest waits for the next batch

    producer.commit_transaction()
    for pipeline in (whole, split, capped):
        run_cli("run", "--pipeline", pipeline.name)
    truth = ground_truth(topic)
    assert truth[next(k for k in truth if k[0] == "/late")][0] == 20
    for pipeline in (whole, split, capped):
        assert table_contents(pipeline) == truth, pipeline.name
    # The split run really cut its ranges (on offsets that include markers and aborted records): what the
    # job reports it ran, against the arithmetic of the limit (23 offsets a task, at least 6 tasks).
    # Packing (several small pieces in one task) cannot merge these pieces: a range of N >= 23 offsets
    # is cut into ceil(N/23) pieces of more than 11 offsets, and two of them exceed the 23 of a task.
    [(first_tasks, first_spans), *later] = [
        (tasks, spans) for tasks, spans in query(
            "SELECT b.read_tasks, array_agg(r.until_offset - r.from_offset) FROM kafka_batch.batches b"
            " JOIN kafka_batch.batch_ranges r ON r.batch_id = b.id WHERE b.pipeline = %s AND b.status = 'committed'"
            " GROUP BY b.id ORDER BY b.id", split.name)
    ]
    assert first_tasks == sum(-(-span // 23) for span in first_spans) >= 40
    assert all(tasks >= 6 for tasks, _ in later)


def test_partition_added_between_runs_is_read_from_its_start(services):
    from confluent_kafka.admin import NewPartitions

    pipeline = new_pipeline("grow", partitions=1, start="latest")
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 100, seed=1)  # before the first run: skipped by 'latest'
    run_cli("run", "--pipeline", pipeline.name)
    assert positions(pipeline.name) == {(topic, 0): 100}  # 'latest': the position is taken at the end
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    producer.produce(topic, key="u", value=b'{"user_id": "u", "page": "/p0", "duration_ms": 5}', partition=0)
    producer.flush(30)
    run_cli("run", "--pipeline", pipeline.name)  # reads the one record written since
    assert positions(pipeline.name) == {(topic, 0): 101}

    admin = admin_client()
    for future in admin.create_partitions([NewPartitions(topic, 2)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": kafka_config()["bootstrap.servers"]})
    # The broker's metadata may show the new partition a moment after the controller created it; a record
    # for a partition the producer does not know fails delivery, and flush() would not say so.
    deadline = time.monotonic() + 30
    while len(producer.list_topics(topic, timeout=10).topics[topic].partitions) < 2:
        assert time.monotonic() < deadline, f"{topic}'s second partition is not in the broker's metadata after 30 s"
        time.sleep(0.2)
    failed = []
    for _ in range(7):
        producer.produce(topic, key="u", value=b'{"user_id": "u", "page": "/p1", "duration_ms": 1}', partition=1,
                         on_delivery=lambda error, _message: error and failed.append(error))
    assert producer.flush(30) == 0 and not failed, failed
    run_cli("run", "--pipeline", pipeline.name)
    assert positions(pipeline.name) == {(topic, 0): 101, (topic, 1): 7}
    views = {page: v for (page, _), (v, _) in table_contents(pipeline).items()}
    assert views == {"/p0": 1, "/p1": 7}
