"""Failover on a three-node cluster (replication factor 3, min.insync.replicas 2): nodes SIGKILLed or
frozen (a host that hangs, SIGSTOP) under a batch with a Kafka sink. Ground truth is the input topic read
by an independent read_committed consumer: the output topic holds every valid record exactly once, the
aggregate table the same totals, the positions are at the input's end. And nothing waits forever: an
attempt whose Kafka call outlasts its bound ends within it, and the next one completes while the node is
still gone. `make test` runs the frozen coordinator, the unclean election's data loss and the
acknowledged write that survives its leader; the node kills (marker long_fault) run in `make chaos`."""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, NewTopic

from kafka_batch import connections
from kafka_batch.kafka.publish import transactional_id
from kafka_batch_dev import sample_data
from kafka_batch_dev.chaos.harness import open_transaction
from tests.integration.failover import (
    BOUND,
    exactly_once,
    leaders_moved,
    publish_under_fault,
    records_published,
    sink_pipeline,
    start_run,
)
from tests.integration.helpers import (
    _committed_messages,
    admin_client,
    ground_truth,
    merged,
    new_pipeline,
    positions,
    query,
    run_cli,
    table_contents,
    update_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_a_publish_whose_coordinator_hangs_ends_within_its_bound_and_the_next_attempt_completes_meanwhile(on_cluster):
    # A frozen node keeps its connections open and answers nothing. The attempt's commit ends within the
    # bound: committed, or a retried error (librdkafka's own timeout, or the watchdog's where librdkafka
    # waits past it: seen here without the watchdog, a run hung in send_offsets_to_transaction for minutes).
    # The next run, on the two other nodes, fences it and completes the batch exactly.
    pipeline, output, run, seconds, node = publish_under_fault(on_cluster, on_cluster.freeze)
    assert seconds < BOUND + 45, seconds  # the bound, then the rollback, the report (lag unknown) and the exit
    status = query("SELECT status FROM kafka_batch.batches WHERE pipeline = %s ORDER BY id", pipeline.name)[-1][0]
    if run.returncode == 0:  # its report's lag known, or "unknown" where the cluster did not answer it
        assert status == "committed", run.stdout[-2000:]
    else:
        assert run.returncode == 4 and status == "failed", run.stderr[-2000:]
        assert f"did not return within {BOUND:g} s" in run.stderr or "Timed out" in run.stderr, run.stderr[-2000:]
    sample_data.produce_page_views(on_cluster.config, pipeline.topics[0], 300, seed=93)
    run_cli("run", "--pipeline", pipeline.name)  # node still frozen
    assert node not in on_cluster.in_sync(output, 0)
    exactly_once(pipeline, output, on_cluster)


@pytest.mark.long_fault
def test_a_publish_whose_coordinators_node_dies_completes_and_the_next_batch_runs_while_it_is_down(on_cluster):
    # A host that dies: the cluster moves the coordinator to another node; the run ends within the bound,
    # whatever happens to the attempt, and the batches after it commit exactly with the node still down.
    pipeline, output, run, seconds, node = publish_under_fault(on_cluster, on_cluster.kill)
    assert seconds < BOUND + 30, (seconds, run.stderr[-2000:])
    assert run.returncode in (0, 4), run.stderr[-2000:]
    sample_data.produce_page_views(on_cluster.config, pipeline.topics[0], 300, seed=93)
    for _ in range(2):  # completes a failed attempt's batch, then the new records
        run_cli("run", "--pipeline", pipeline.name)
    assert node not in on_cluster.in_sync(output, 0)  # it was down all along
    exactly_once(pipeline, output, on_cluster)


@pytest.mark.long_fault
def test_one_node_down_for_a_whole_batch_and_the_leader_of_a_partition_killed_while_it_is_read(on_cluster):
    pipeline, output = sink_pipeline("onedown", on_cluster)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(on_cluster.config, topic, 1000, seed=94)
    down = on_cluster.leader(topic, 0)
    on_cluster.kill(down)  # reads and publishes go on with two of three, once the cluster has moved its leaders
    leaders_moved(on_cluster, topic, range(1), down)
    run_cli("run", "--pipeline", pipeline.name)
    assert down not in on_cluster.in_sync(output, 0)
    on_cluster.revive()
    sample_data.produce_page_views(on_cluster.config, topic, 150_000, seed=95)
    proc = start_run(pipeline.name)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:  # the batch's attempt has begun: Spark reads
        if query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s AND status = 'planned'"
                 " AND attempt >= 1", pipeline.name)[0][0]:
            break
        time.sleep(0.05)
    killed = on_cluster.leader(topic, 1)
    on_cluster.kill(killed)
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 0:  # the read failed over or failed: either way the next run completes the batch
        assert proc.returncode == 4, err[-2000:]
    leaders_moved(on_cluster, topic, range(3), killed)  # then the next run, as Airflow's retry would
    leaders_moved(on_cluster, output, range(2), killed)
    records_published(pipeline, output, on_cluster)


@pytest.mark.long_fault
def test_a_publish_refused_for_lack_of_in_sync_replicas_changes_nothing_and_completes_once_a_node_is_back(on_cluster):
    # Too few in-sync replicas for the output topic's min.insync.replicas: Kafka refuses acks=all writes.
    # (Two nodes of three down would show the same, but would also take the controllers' quorum with them
    # in this combined cluster: here the topic asks for three in sync, and one node is down.)
    from confluent_kafka.admin import AdminClient, ConfigResource

    pipeline, output = sink_pipeline("isr", on_cluster)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(on_cluster.config, topic, 200, seed=96)
    run_cli("run", "--pipeline", pipeline.name)
    admin = AdminClient(on_cluster.config)  # referenced until its answer
    resource = ConfigResource(ConfigResource.Type.TOPIC, output, incremental_configs=[
        ConfigEntry("min.insync.replicas", "3", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    down = next(node for node in on_cluster.in_sync(output, 0) if node != on_cluster.leader(output, 0))
    on_cluster.kill(down)
    deadline = time.monotonic() + 90
    while down in on_cluster.in_sync(output, 0) + on_cluster.in_sync(output, 1) and time.monotonic() < deadline:
        time.sleep(1)
    sample_data.produce_page_views(on_cluster.config, topic, 200, seed=97)
    before = (positions(pipeline.name), query(f"SELECT sum(views) FROM public.{pipeline.sink_settings.aggregate.table}"),
              sum(1 for _ in _committed_messages(output, [0, 1], on_cluster.config)))

    # Refused before anything is produced, or (seen once) already when the producer starts: the coordinator
    # could not end the id's last transaction, whose markers need the topic's in-sync replicas too.
    refused = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert refused.returncode == 4, refused.stderr[-2000:]  # retried: it mends itself once a node is back
    assert "fewer than its min.insync.replicas 3" in refused.stderr and output in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (positions(pipeline.name), query(f"SELECT sum(views) FROM public.{pipeline.sink_settings.aggregate.table}"),
            sum(1 for _ in _committed_messages(output, [0, 1], on_cluster.config))) == before

    on_cluster.revive()
    deadline = time.monotonic() + 90
    while len(on_cluster.in_sync(output, 0)) < 3 or len(on_cluster.in_sync(output, 1)) < 3:
        assert time.monotonic() < deadline, "the node did not rejoin the in-sync replicas"
        time.sleep(1)
    run_cli("run", "--pipeline", pipeline.name)
    exactly_once(pipeline, output, on_cluster)


def _elect_uncleanly(cluster, topic: str, follower: int, leader: int) -> None:
    """`follower` (out of sync since it died) becomes the partition's leader after `leader` dies: the
    topic allows unclean elections; asked for, where the controller has not made one by itself."""
    from confluent_kafka import ElectionType, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    cluster.kill(leader)
    cluster.revive(only={follower})
    admin = AdminClient(cluster.config)  # referenced until its answer
    deadline = time.monotonic() + 120
    while cluster.leader(topic, 0) != follower:
        assert time.monotonic() < deadline, f"node {follower} was not elected: {cluster.leader(topic, 0)}"
        # No controller quorum yet (no answer), or the controller elected it meanwhile (an error).
        with contextlib.suppress(KafkaException, TimeoutError):
            admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(topic, 0)]).result(timeout=15)
        time.sleep(1)


def test_a_log_truncated_below_the_position_by_an_unclean_election_is_data_loss_never_a_silent_read(on_cluster):
    # Two replicas, one in sync enough (min.insync.replicas 1), unclean elections allowed: the follower dies,
    # the leader takes 50 records alone, the pipeline commits them, the leader dies and the follower,
    # without them, is elected. The log now ends below the position; then new records take those offsets.
    # Ground truth: what a plain read_committed consumer read of the topic before and after.
    pipeline = new_pipeline("unclean", partitions=0)
    topic = pipeline.topics[0]
    leader, follower = 2, 3  # node 1 stays up throughout: with the follower back, two of three voters
    admin = admin_client(on_cluster.config)
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1, replica_assignment=[[leader, follower]], config={
            "min.insync.replicas": "1", "unclean.leader.election.enable": "true"})]).values():
        future.result(timeout=60)
    sample_data.wait_for_topic(admin, topic, 1)
    sample_data.produce_page_views(on_cluster.config, topic, 100, seed=101)
    run_cli("run", "--pipeline", pipeline.name)
    on_cluster.kill(follower)
    deadline = time.monotonic() + 90
    while on_cluster.in_sync(topic, 0) != [leader]:
        assert time.monotonic() < deadline, on_cluster.in_sync(topic, 0)
        time.sleep(1)
    sample_data.produce_page_views(on_cluster.config, topic, 50, seed=102)
    run_cli("run", "--pipeline", pipeline.name)
    read = list(_committed_messages(topic, [0], on_cluster.config))  # the 150 records the pipeline committed
    assert len(read) == 150 and positions(pipeline.name) == {(topic, 0): 150}
    _elect_uncleanly(on_cluster, topic, follower, leader)

    ends_below = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert ends_below.returncode == 5, ends_below.stderr[-2000:]  # data loss: an operator decides
    assert (f"{topic}[0]: data loss: its log ends at 100, below the stored position 150: records 100..150 that"
            " batches committed are no longer in it") in ends_below.stderr, ends_below.stderr[-2000:]
    sample_data.produce_page_views(on_cluster.config, topic, 80, seed=103)  # offsets 100..179: other records
    written_over = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert written_over.returncode == 5, written_over.stderr[-2000:]
    assert (f"{topic}[0]: data loss: its leader's log differs from offset 100 on, below the stored position 150"
            in written_over.stderr), written_over.stderr[-2000:]
    assert positions(pipeline.name) == {(topic, 0): 150}
    assert table_contents(pipeline) == ground_truth(topic, messages=read)

    update_pipeline(pipeline.name, on_data_loss="skip")  # the operator accepts the loss: read on
    run_cli("run", "--pipeline", pipeline.name)
    now = list(_committed_messages(topic, [0], on_cluster.config))
    assert [m.offset() for m in now] == list(range(180))
    assert table_contents(pipeline) == merged(ground_truth(topic, messages=read),
                                              ground_truth(topic, messages=[m for m in now if m.offset() >= 150]))
    assert positions(pipeline.name) == {(topic, 0): 180}
    assert query("SELECT lost_from, lost_until FROM kafka_batch.data_loss WHERE pipeline = %s", pipeline.name) == [
        (100, 150)]
    on_cluster.revive()  # the old leader comes back and truncates its log to the new leader's


@pytest.mark.long_fault
def test_the_transaction_coordinators_node_killed_while_the_transaction_is_open(on_cluster):
    # Shape rows opens the batch's Kafka transaction before its read and produces while Spark reads: the
    # node that coordinates the transactional id dies with the transaction open. The coordinator moves
    # (the transaction state is replicated); the attempt commits, or ends within its bound as retried and
    # the next one (a new producer fencing the old) publishes the batch, once.
    pipeline, output = sink_pipeline("txnopen", on_cluster, coordinators_apart=True)
    tid = transactional_id(pipeline.name, output)
    sample_data.produce_page_views(on_cluster.config, pipeline.topics[0], 60_000, seed=111)
    node = on_cluster.transaction_coordinator(tid)
    admin = admin_client(on_cluster.config)
    proc = start_run(pipeline.name)
    deadline = time.monotonic() + 180
    while not open_transaction(admin, output, [0, 1]):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never opened its transaction"
        time.sleep(0.02)
    on_cluster.kill(node)
    started = time.monotonic()
    out, err = proc.communicate(timeout=BOUND + 180)
    assert proc.returncode in (0, 4), err[-2000:]
    assert time.monotonic() - started < BOUND + 120, err[-2000:]
    assert node != on_cluster.transaction_coordinator(tid)  # moved to another node
    records_published(pipeline, output, on_cluster)  # the node still down


@pytest.mark.long_fault
def test_the_transaction_coordinators_node_killed_between_the_kafka_and_the_postgres_commit(on_cluster):
    # The batch's Kafka transaction committed, its Postgres commit held (a gate at COMMIT): the node that
    # coordinated the transaction dies and the Postgres transaction is ended without committing, as a crash
    # there leaves it. The next run finds the batch published (its identity is in the publish group, on
    # another node) and commits it in Postgres without publishing it again, while the node is down.
    from kafka_batch_dev.gates import commit_gate

    pipeline, output = sink_pipeline("txnbetween", on_cluster, coordinators_apart=True)
    tid = transactional_id(pipeline.name, output)
    sample_data.produce_page_views(on_cluster.config, pipeline.topics[0], 3000, seed=112)
    node = on_cluster.transaction_coordinator(tid)
    params = connections.postgres_params(connections.from_environment("kafka_batch_postgres"))
    gate = commit_gate(params, pipeline.name)
    try:
        proc = start_run(pipeline.name)
        assert gate.wait_for_a_session(180, alive=lambda: proc.poll() is None), proc.communicate()[1][-2000:]
        published = sum(1 for _ in _committed_messages(output, [0, 1], on_cluster.config))
        assert published == 3000  # the Kafka transaction committed
        on_cluster.kill(node)
        gate.terminate_waiting()  # the Postgres transaction ends uncommitted
    finally:
        gate.open()
    proc.communicate(timeout=BOUND + 120)
    assert proc.returncode != 0
    assert query("SELECT count(*) FROM kafka_batch.batches WHERE pipeline = %s AND status = 'committed'",
                 pipeline.name) == [(0,)]
    records_published(pipeline, output, on_cluster)  # committed once in Postgres, published once


@pytest.mark.long_fault
def test_the_active_controller_killed_as_a_batch_is_planned(on_cluster):
    # The node leading the controllers' quorum dies as planning asks for the partitions' offsets: the
    # quorum elects another controller, which moves the dead node's leaderships; planning waits for
    # the new leaders (or ends retried within read.kafka_timeout_seconds), and the batches commit exactly.
    pipeline, output = sink_pipeline("controller", on_cluster)
    sample_data.produce_page_views(on_cluster.config, pipeline.topics[0], 3000, seed=113)
    controller = on_cluster.active_controller()
    on_cluster.kill(controller)
    first = run_cli("run", "--pipeline", pipeline.name, check=False)
    assert first.returncode in (0, 4), first.stderr[-2000:]
    assert on_cluster.active_controller() not in (controller, -1)
    sample_data.produce_page_views(on_cluster.config, pipeline.topics[0], 1000, seed=114)
    records_published(pipeline, output, on_cluster)


def test_what_the_sinks_producer_acknowledged_survives_its_leader_dying_before_the_followers_copied_it(on_cluster):
    # Why the sink's producer writes with acks=all and idempotence (publish.DURABLE). The followers of a
    # partition freeze (in sync still: a host that hangs), records are sent to the leader, and the leader
    # dies; the followers come back and one is elected: it never had what the leader took alone. A record
    # the producer acknowledged must be in the log, once. With acks=1 the leader acknowledges alone and the
    # records are lost; without idempotence a retry can write one twice.
    from confluent_kafka import Producer

    from kafka_batch.kafka.publish import DURABLE

    leader, *followers = (1, 2, 3)
    topic = f"durable_{uuid.uuid4().hex[:8]}"
    admin = admin_client(on_cluster.config)
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1,
                                                replica_assignment=[[leader, *followers]])]).values():
        future.result(timeout=60)
    sample_data.wait_for_topic(admin, topic, 1)
    deadline = time.monotonic() + 60
    while on_cluster.in_sync(topic, 0) != [1, 2, 3]:
        assert time.monotonic() < deadline, on_cluster.in_sync(topic, 0)
        time.sleep(0.5)
    acknowledged: list[bytes] = []
    producer = Producer({**on_cluster.config, **DURABLE, "linger.ms": 5, "message.timeout.ms": 240_000})
    for node in followers:
        on_cluster.freeze(node)
    try:
        for n in range(500):
            producer.produce(topic, value=b"%d" % n,
                             on_delivery=lambda err, msg: err is None and acknowledged.append(msg.value()))
        waited = time.monotonic() + 5  # what the leader acknowledges while it holds the records alone
        while time.monotonic() < waited:
            producer.poll(0.1)
        on_cluster.kill(leader)
    finally:
        on_cluster.thaw()
    assert producer.flush(240) == 0  # every record delivered or failed within its timeout
    in_log = [m.value() for m in _committed_messages(topic, [0], on_cluster.config)]
    assert on_cluster.leader(topic, 0) in followers
    assert sorted(acknowledged) == sorted(set(acknowledged)) and set(acknowledged) <= set(in_log), (
        f"{len(set(acknowledged) - set(in_log))} acknowledged records lost")
    assert len(in_log) == len(set(in_log)) == len(acknowledged) == 500  # each once
