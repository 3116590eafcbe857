"""A host that hangs (SIGSTOP) on a three-node cluster: the node coordinating a Kafka sink's publish group
frozen inside the commit. Nothing waits forever: the attempt ends within its bound, and the next one
completes exactly while the node is still frozen. Ground truth as in test_failover.py."""

from __future__ import annotations

import pytest

from kafka_batch_dev import sample_data
from tests.integration.failover import BOUND, exactly_once, publish_under_fault
from tests.integration.helpers import query, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# A hung node stays registered for 30 s (Kafka's default broker.session.timeout.ms: 9 s), as a host whose
# heartbeats stall: the commit's coordinator lookup still names it, and librdkafka's
# send_offsets_to_transaction waits past its own timeout there (confluentinc/librdkafka#5456).
BROKER_SESSION_TIMEOUT_MS = 30_000


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


