"""What the failover tests share: a pipeline with a Kafka sink on a three-node cluster, a run started in the
background or held at its commit, and the check against ground truth (the input topic read by an
independent read_committed consumer): the output topic holds every valid record exactly once, the aggregate
table the same totals, the positions are at the input's end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psycopg2

from kafka_batch import connections
from kafka_batch.kafka.bounded import GRACE_SECONDS
from kafka_batch.kafka.publish import transactional_id
from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    _committed_messages,
    create_topic,
    ground_truth,
    new_pipeline,
    positions,
    query,
    run_cli,
    update_pipeline,
)

# The sink's call_timeout_seconds: a call ends the attempt within it and the grace, whether librdkafka keeps
# to it (it does when a frozen node holds the transaction coordinator's write back) or not (the commit's
# offsets sent to a frozen group coordinator: confluentinc/librdkafka#5456, a hang the watchdog ends).
CALL_TIMEOUT = 30
BOUND = CALL_TIMEOUT + GRACE_SECONDS


def sink_pipeline(prefix: str, cluster, coordinators_apart: bool = False):
    """A pipeline totalling page views and publishing each to an output topic. `coordinators_apart`: the
    output's name is chosen so that different nodes coordinate its publish group and its transactions."""
    pipeline = new_pipeline(prefix)
    names = (f"{pipeline.name}_out{i}" for i in range(100))
    output = next(names)
    if coordinators_apart:  # where the cluster's leaders allow it
        cluster.warm()
        apart = [name for name in names if cluster.group_leader(transactional_id(pipeline.name, name))
                 != cluster.transaction_coordinator(transactional_id(pipeline.name, name))]
        output = apart[0] if apart else output
    create_topic(output, 2)
    pipeline = update_pipeline(pipeline.name, sinks={**pipeline.definition["sinks"], "kafka": {
        "topic": output, "key": "user_id", "value": {"page": "page"}, "call_timeout_seconds": CALL_TIMEOUT}})
    return pipeline, output


def start_run(name: str) -> subprocess.Popen:
    cli = str(Path(sys.executable).parent / "kafka-batch")
    return subprocess.Popen([cli, "run", "--pipeline", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=os.environ.copy())


@contextmanager
def commit_held(name: str):
    """The pipeline's next commit waits at its compare-and-set of positions while the block runs (this
    session holds their rows); the block gets a function that waits until it does."""
    params = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
    holder, probe = psycopg2.connect(**params), psycopg2.connect(**params)
    probe.autocommit = True
    with holder.cursor() as cur:
        cur.execute("SELECT 1 FROM kafka_batch.offsets WHERE pipeline = %s FOR UPDATE", (name,))

    def waiting(proc: subprocess.Popen, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        with probe.cursor() as cur:
            while proc.poll() is None and time.monotonic() < deadline:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE %s", ("%kafka_batch.offsets%",))
                if cur.fetchone()[0]:
                    return
                time.sleep(0.05)
        raise AssertionError(f"the run never reached its commit: {proc.poll()}")

    try:
        yield waiting
    finally:
        holder.rollback()
        holder.close()
        probe.close()


def exactly_once(pipeline, output: str, cluster) -> None:
    """Against the input topic read independently: every record read, published once, totalled once."""
    topic = pipeline.topics[0]
    expected = Counter()
    ends = {}
    for message in _committed_messages(topic, [0, 1, 2], cluster.config):
        expected[f"{topic}:{message.partition()}:{message.offset()}"] += 1
        ends[(topic, message.partition())] = message.offset() + 1
    assert all(positions(pipeline.name).get(tp, 0) >= end for tp, end in ends.items()), positions(pipeline.name)
    published = Counter(dict(m.headers())["kafka_batch.source"].decode()
                        for m in _committed_messages(output, [0, 1], cluster.config))
    assert published == expected
    table = pipeline.sink_settings.aggregate.table
    truth = ground_truth(topic, config=cluster.config)
    assert query(f"SELECT sum(views), sum(total_duration_ms) FROM public.{table}") == [
        (sum(v for v, _ in truth.values()), sum(d for _, d in truth.values()))]


def publish_under_fault(cluster, fault) -> tuple[object, str, subprocess.CompletedProcess, float, int]:
    """A pipeline's second batch, its commit held until `fault(node)` struck the node that coordinates its
    Kafka sink's publish group (not its transactions); the run's result, how long it took from the
    release, and the node."""
    pipeline, output = sink_pipeline("failover", cluster, coordinators_apart=True)
    sample_data.produce_page_views(cluster.config, pipeline.topics[0], 300, seed=91)
    run_cli("run", "--pipeline", pipeline.name)  # the publish group exists now: its coordinator can be asked
    node = cluster.group_coordinator(transactional_id(pipeline.name, output))
    sample_data.produce_page_views(cluster.config, pipeline.topics[0], 300, seed=92)
    with commit_held(pipeline.name) as commit_waits:
        proc = start_run(pipeline.name)
        commit_waits(proc)
        fault(node)
    released = time.monotonic()
    try:
        out, err = proc.communicate(timeout=BOUND + 120)
    finally:
        proc.kill()
    return pipeline, output, subprocess.CompletedProcess(proc.args, proc.returncode, out, err), \
        time.monotonic() - released, node


def leaders_moved(cluster, topic: str, partitions: range, dead: int, timeout: float = 120) -> None:
    """Until every partition is led by a node other than `dead` (whose session must expire first: a
    loaded machine takes longer)."""
    deadline = time.monotonic() + timeout
    while any(cluster.leader(topic, p) in (dead, -1) for p in partitions):
        assert time.monotonic() < deadline, f"{topic}'s partitions still led by node {dead} or none"
        time.sleep(1)


def records_published(pipeline, output: str, cluster) -> None:
    """A batch up to the input's end (retried once, as Airflow would, where it met the cluster still failing
    over: a dead node's partitions wait for a leader until its session expires), then exactly
    once against the input read independently."""
    first = run_cli("run", "--pipeline", pipeline.name, check=False)
    if first.returncode != 0:
        assert first.returncode == 4 and "no leader" in first.stderr, first.stderr[-2000:]
        run_cli("run", "--pipeline", pipeline.name)
    exactly_once(pipeline, output, cluster)
