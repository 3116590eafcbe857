"""Many batches at once: pipelines started together on the tests' one Spark Connect server (one shared
session) and one Postgres, two of them reading each topic, round after round with records added
between. Every batch commits, none is starved (each round's batches all end), and every pipeline's
table equals its topic's totals read by a plain read_committed consumer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_batch_dev import sample_data
from tests.integration.helpers import batches_of, create_topic, ground_truth, kafka_config, new_pipeline, table_contents

pytestmark = pytest.mark.integration
PIPELINES, TOPICS, ROUNDS = 8, 4, 2


def _together(pipelines) -> dict[str, float]:
    """`kafka-batch run` of every pipeline at once; each one's seconds (a failure fails the test)."""
    cli = str(Path(sys.executable).parent / "kafka-batch")
    started = time.monotonic()
    running = {p.name: subprocess.Popen([cli, "run", "--pipeline", p.name], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
               for p in pipelines}
    took = {}
    for name, proc in running.items():
        output, _ = proc.communicate(timeout=600)
        took[name] = time.monotonic() - started
        assert proc.returncode == 0, f"{name}: {output[-3000:]}"
    return took


def test_pipelines_started_together_all_commit_exactly(services):
    topics = [f"together_{n}_{os.getpid()}_{time.time_ns() % 10**6}" for n in range(TOPICS)]
    for topic in topics:
        create_topic(topic, 2)
    pipelines = [new_pipeline("together", partitions=0, topics=[topics[n % TOPICS]]) for n in range(PIPELINES)]
    for round_ in range(ROUNDS):
        for n, topic in enumerate(topics):
            sample_data.produce_page_views(kafka_config(), topic, 300 + 50 * n, seed=10 * round_ + n)
        took = _together(pipelines)
        assert max(took.values()) < 300, took
        for pipeline in pipelines:
            statuses = [b[2] for b in batches_of(pipeline.name)]
            assert statuses == ["committed"] * (round_ + 1), (pipeline.name, statuses)
    truth = {topic: ground_truth(topic) for topic in topics}
    for pipeline in pipelines:
        assert table_contents(pipeline) == truth[pipeline.topics[0]], pipeline.name
