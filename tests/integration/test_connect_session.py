"""An attempt killed with its process on the shared Spark Connect session. The server keeps running what
the attempt asked for (a Connect execution outlives its client until a detached timeout) and keeps its
cached read for as long as the session lives; the pipeline's next batch interrupts the one and uncaches
the other. Seen through the server's own REST API (its jobs and its cached RDDs), on a server of the
test's own with its UI on; the results compared with the topic read independently."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest

from kafka_batch.spark.job import batch_tag
from kafka_batch_dev import sample_data
from kafka_batch_dev.local_stack import free_port
from tests.integration.helpers import (
    _committed_messages,
    batches_of,
    create_topic,
    ground_truth,
    kafka_config,
    new_pipeline,
    own_spark_connect,
    run_cli,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration


def _api(ui: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/api/v1/{path}", timeout=10) as response:
        return json.load(response)


def _batch_jobs(ui: int, app: str, batch_id: int) -> dict[int, str]:
    """The status of every Spark job the server ran for the batch (its operations carry the batch's tag)."""
    return {job["jobId"]: job["status"] for job in _api(ui, f"applications/{app}/jobs")
            if any(tag.endswith(batch_tag(batch_id)) for tag in job.get("jobTags", []))}


def _reading_cached(ui: int, app: str, pipeline_name: str) -> int | None:
    """The pipeline's batch once the server runs its read and holds part of it cached."""
    planned = batches_of(pipeline_name)
    if not planned or "RUNNING" not in _batch_jobs(ui, app, planned[0][0]).values():
        return None
    return planned[0][0] if _api(ui, f"applications/{app}/storage/rdd") else None


def test_the_next_batch_stops_and_uncaches_what_a_killed_attempt_left_on_the_server(services, tmp_path):
    ui = free_port()
    with own_spark_connect(tmp_path, "spark_connect_own", extra={"spark.ui.enabled": "true", "spark.ui.port": ui}):
        output = f"connectkill_{uuid.uuid4().hex[:8]}_out"
        create_topic(output, 1)
        # An aggregate and a Kafka sink: both compute from one cached read. A thousand small tasks make a
        # run that outlasts the next one's start, however loaded the machine (200 did not, under load).
        pipeline = new_pipeline("connectkill", partitions=2, connections={"spark": "spark_connect_own"},
                                limits={"max_records_per_task": 20},
                                sinks={"kafka": {"topic": output, "value": {"page": "page"}, "headers": []}})
        topic = pipeline.topics[0]
        sample_data.produce_page_views(kafka_config(), topic, 20_000, seed=95)
        [app] = _api(ui, "applications")

        cli = [str(Path(sys.executable).parent / "kafka-batch"), "run", "--pipeline", pipeline.name, "--verbose"]
        with open(tmp_path / "killed-attempt.log", "wb") as log:
            first = subprocess.Popen(cli, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while (batch_id := _reading_cached(ui, app["id"], pipeline.name)) is None:
                assert first.poll() is None, (tmp_path / "killed-attempt.log").read_text()
                assert time.monotonic() < deadline, "the batch's read never ran cached on the server"
                time.sleep(0.2)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        # The client is gone; its job runs on, and its read stays cached.
        killed = {job for job, status in _batch_jobs(ui, app["id"], batch_id).items() if status == "RUNNING"}
        assert killed
        assert _api(ui, f"applications/{app['id']}/storage/rdd")

        # The next run supersedes the killed batch (it never published) and plans the same records anew,
        # in tasks of the usual size.
        pipeline = update_pipeline(pipeline.name, limits={"max_records_per_task": 1_000_000})
        retry = run_cli("run", "--pipeline", pipeline.name, "--verbose")
        # The killed attempt's read was interrupted (not run to its end), and nothing stays cached.
        jobs = _batch_jobs(ui, app["id"], batch_id)
        assert "RUNNING" not in jobs.values() and "FAILED" in {jobs[job] for job in killed}, jobs
        assert _api(ui, f"applications/{app['id']}/storage/rdd") == []
        assert "of an attempt that can no longer commit were still running" in retry.stderr, retry.stderr
        assert [b[2] for b in batches_of(pipeline.name)] == ["superseded", "committed"]

        assert table_contents(pipeline) == ground_truth(topic)
        published = Counter(json.loads(m.value())["page"] for m in _committed_messages(output, [0]))
        assert published == Counter(json.loads(m.value())["page"] for m in _committed_messages(topic, [0, 1]))
