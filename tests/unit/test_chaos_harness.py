"""The fault-injection harness's own bound: a struck run that hangs is a violation, never a wait forever."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from kafka_batch_dev.chaos.harness import RunHung, finish, until


def _alive_in_group(group: int) -> list[int]:
    """The processes of a process group that still run (a killed child may linger as a zombie until reaped)."""
    alive = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def test_a_run_past_its_bound_is_killed_with_its_group_and_named():
    run = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    started = time.monotonic()
    with pytest.raises(RunHung, match=r"a run \(-c sleep 60 & sleep 60, pid \d+\) did not end within 0.5 s"):
        finish(run, bound=0.5)
    assert time.monotonic() - started < 10
    assert run.returncode is not None  # ended, and so were its children (its process group)
    assert until(lambda: not _alive_in_group(run.pid), 5), _alive_in_group(run.pid)


def test_a_run_within_its_bound_gives_its_exit_code():
    assert finish(subprocess.Popen(["bash", "-c", "exit 3"], start_new_session=True), bound=30) == 3
