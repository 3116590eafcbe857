"""kafka_batch_daemon.preloaded: pyspark's worker daemon with the read's libraries imported, and nothing
of kafka_batch (the workers it forks must import kafka_batch from the batch's own package)."""

from __future__ import annotations

import json
import subprocess
import sys

# After the daemon's imports: a read task's modules, and its first conversion of Python values to Arrow.
_READ_TASK = """
import json, sys
import kafka_batch_daemon.preloaded
daemon = set(sys.modules)
import pyarrow as pa
import kafka_batch.spark.reader, kafka_batch.spark.json_fields, kafka_batch.formats.avro, kafka_batch.formats.protobuf
pa.array([1, 2], pa.int64())
print(json.dumps({"daemon": sorted(daemon), "task": sorted(set(sys.modules) - daemon)}))
"""


def _modules() -> dict[str, list[str]]:
    result = subprocess.run([sys.executable, "-c", _READ_TASK], check=True, capture_output=True, text=True)
    return json.loads(result.stdout)


def test_the_daemon_imports_nothing_of_kafka_batch():
    daemon = _modules()["daemon"]
    assert not [m for m in daemon if m == "kafka_batch" or m.startswith("kafka_batch.")]


def test_a_read_task_forked_from_it_imports_no_library_the_daemon_could_have():
    libraries = {"pyarrow", "pandas", "numpy", "confluent_kafka", "fastavro", "google", "pyspark"}
    task = _modules()["task"]
    assert not [m for m in task if m.split(".")[0] in libraries], task
