"""The README's quick start as a newcomer runs it: its `make demo` line, as written, from another directory
(`make -C <clone>`, as the README says works), on a local home of its own; what the README says it does
is checked in what it prints (each of its checks against the topics passed), and after `make down`
nothing it started still runs and nothing of it is left outside that home.

Not part of `make test` (whose services would be a second set beside the demo's): `make test-quickstart`
runs it, and CI runs it after `make test`.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.quickstart

README = ROOT / "README.md"
# What `make demo` prints when each of its checks holds, in the order the README describes them.
VERDICTS = [
    r"added 20000 views for 20000 produced records: exactly the new records",
    r"added 5000 views for 5000 produced records: exactly the new records",
    r"added 10000 views for 10000 produced records, 5000 of them from version-1 records read with the default"
    r" country: exactly the new records",
    r"the compacted topic holds \d+ pages, the table \d+, \d+ views in both pipelines: the topic equals the table",
]


def _quick_start_commands() -> list[str]:
    """The commands of the README's "Quick start" block, comments dropped."""
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def _started_from(home: Path) -> list[psutil.Process]:
    """Processes whose command line or working directory is under the local home."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        try:
            text = " ".join(process.info["cmdline"] or []) + " " + (process.info["cwd"] or "")
        except psutil.Error:
            continue
        if str(home) in text:
            found.append(process)
    return found


def _temporary_entries() -> set[str]:
    return set(os.listdir(tempfile.gettempdir()))


def test_the_readme_quick_start_runs_as_written_and_leaves_nothing_running(tmp_path):
    commands = _quick_start_commands()
    assert commands[0] == "make demo", commands  # the first command a newcomer runs
    # A private directory, as a fresh clone's .local is in CI's: only its owner can enter its parent.
    home = Path(tempfile.mkdtemp(prefix="kafka_batch_quickstart_")) / "local"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "KAFKA_BATCH_HOME": str(home),
           "LANG": "C.UTF-8"}
    before = _temporary_entries()
    make = ["make", "-C", str(ROOT)]
    try:
        demo = subprocess.run(make + commands[0].split()[1:], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=1800)
        said = demo.stdout + demo.stderr
        assert demo.returncode == 0, said[-6000:]
        for verdict in VERDICTS:
            assert re.search(verdict, demo.stdout), (verdict, demo.stdout[-6000:])
        assert "MISMATCH" not in demo.stdout
        # What the README says it prints: the committed positions and the top rows of page_view_minutes.
        assert "committed offsets of pipeline page_views:" in demo.stdout
        assert "top rows of page_view_minutes:" in demo.stdout
        assert "make down" in demo.stdout  # it ends by saying how to stop the services
    finally:
        down = subprocess.run(make + ["down"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    left = _started_from(home)
    assert not left, [" ".join(p.cmdline()) for p in left]
    # Nothing of the demo outside its home (Spark's and the services' scratch included), pytest's own aside.
    added = {name for name in _temporary_entries() - before if not name.startswith(("pytest-", "kafka_batch_quickstart_"))}
    assert not added, ", ".join(sorted(added))
