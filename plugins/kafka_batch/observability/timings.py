"""Wall-clock marks of a batch's phases (CLI, Spark driver, read tasks), for `make bench`.

Off unless KAFKA_BATCH_TIMINGS names a file: then each mark appends one JSON line to it. The
variable reaches spark-submit, the driver and (in local mode) the Python workers through their
environment; appends of one short line are atomic, so processes can share the file.
"""

from __future__ import annotations

import json
import os
import time

ENV = "KAFKA_BATCH_TIMINGS"


def mark(event: str, **extra) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **extra}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
