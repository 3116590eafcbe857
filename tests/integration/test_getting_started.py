"""docs/getting-started.md's "Your first pipeline", as a newcomer follows it: its blocks run in order, as
written, in a shell that has only sourced the local home's env.sh (no virtualenv on PATH before it), and
what the page says they do is checked against the topic read independently: the 10,000 orders added,
nothing more on a second run, exactly the new ones after more are produced, the two mistakes it shows
said as it shows them."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.integration.helpers import ROOT, _committed_messages, query

pytestmark = pytest.mark.integration

GUIDE = ROOT / "docs" / "getting-started.md"


def _blocks() -> list[tuple[str, str]]:
    """The section's code blocks, in order: (language, text)."""
    text = GUIDE.read_text()
    section = text[text.index("## Your first pipeline"):text.index("## Where to go next")]
    return re.findall(r"```(\w*)\n(.*?)```", section, re.S)


def _shell(home: Path, script: str) -> subprocess.CompletedProcess:
    """`script` in bash after `source <home>/env.sh`, from a PATH without the virtualenv."""
    return subprocess.run(["bash", "-c", f"source {home}/env.sh\n{script}"], cwd=home, capture_output=True,
                          text=True, timeout=600, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)})


def _truth(topic: str) -> Counter:
    """Orders and cents per country, from the topic read with a plain read_committed consumer."""
    totals: Counter = Counter()
    for message in _committed_messages(topic, [0, 1, 2]):
        order = json.loads(message.value())
        totals[(order["country"], "orders")] += 1
        totals[(order["country"], "cents")] += order["cents"]
    return totals


def _table() -> Counter:
    totals: Counter = Counter()
    for country, orders, cents in query("SELECT country, sum(orders), sum(revenue_cents) FROM public.order_revenue_hourly"
                                        " GROUP BY country"):
        totals[(country, "orders")] += orders
        totals[(country, "cents")] += cents
    return totals


def test_the_guides_first_pipeline_runs_as_written(services, tmp_path):
    from kafka_batch_dev import local_stack

    home = tmp_path
    local_stack.write_env_file(home, services)  # what `make up` writes to .local/env.sh
    pipelines = Path(services["KAFKA_BATCH_PIPELINES_DIR"])
    [produce, definition, type_mistake, expression_mistake, commands, table] = _blocks()
    assert (produce[0], definition[0], commands[0], table[0]) == ("bash", "yaml", "bash", "bash")

    # 1. The topic and some records.
    made = _shell(home, produce[1])
    assert made.returncode == 0, made.stderr[-3000:]
    assert sum(_truth("orders").values()) and sum(n for (_, what), n in _truth("orders").items() if what == "orders") == 10_000

    # 2. The definition, saved as the page says; the mistakes it shows, said as it shows them.
    path = pipelines / "orders.yaml"
    raw = yaml.safe_load(definition[1])
    for mistake, changed in ((type_mistake[1], {"orders": {"expr": "1", "type": "text"}}),
                             (expression_mistake[1], {"revenue_cents": "cent"})):
        broken = {**raw, "sinks": {"aggregate": {**raw["sinks"]["aggregate"], "measures": {
            **raw["sinks"]["aggregate"]["measures"], **changed}}}}
        path.write_text(yaml.safe_dump(broken, sort_keys=False))
        said = _shell(home, "kafka-batch run --pipeline orders")
        assert said.returncode == 2, said.stderr[-3000:]
        assert said.stderr.strip() == mistake.strip().replace("<clone>/pipelines", str(pipelines)), said.stderr
    path.write_text(definition[1])

    # 3. A dry run, then a batch: the 10,000 orders added; again: nothing added.
    ran = _shell(home, commands[1])
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "dry run:" in ran.stdout and "10000 offsets" in ran.stdout, ran.stdout[-3000:]
    assert _table() == _truth("orders")
    assert _shell(home, "kafka-batch run --pipeline orders").returncode == 0
    assert _table() == _truth("orders")
    # Produce more and run again: exactly the new orders are added.
    assert _shell(home, produce[1]).returncode == 0
    assert _shell(home, "kafka-batch run --pipeline orders").returncode == 0
    assert _table() == _truth("orders") and sum(n for (_, what), n in _table().items() if what == "orders") == 20_000
    # The table, as the page looks at it.
    shown = _shell(home, table[1])
    assert shown.returncode == 0, shown.stderr[-3000:]
    rows = [line.split() for line in shown.stdout.splitlines()]
    assert sum(int(row[-2]) for row in rows) == 20_000
