"""What every part shares: the machine settled before a measure, each measure's row (its best round kept,
every sample with it), and the table of targets with PASS or FAIL, written as JSON."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import psutil
from confluent_kafka.admin import AdminClient

ROWS: list[dict] = []
# A child of the bench (a peer's or the pipeline's run, a build, a fetch) still going after this has hung:
# the largest, 3M records on two busy cores, takes a few minutes.
CHILD_TIMEOUT_S = 1800
# Seconds of each system's best run by records per batch, from its command's start: the chart's points.
CURVE: dict[str, dict[int, float]] = defaultdict(dict)
# CPU seconds of each system's least costly run by records per batch (its own processes: a batch's command
# and the Spark Connect server's; not the broker's or Postgres'): the chart's second panel.
CPU: dict[str, dict[int, float]] = defaultdict(dict)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def settle(idle_pct: float = 15.0, longest_s: float = 180.0) -> None:
    """Wait until the machine is nearly idle before a measure: after a large produce or batch the services
    keep working for a while (the broker's and Postgres's writes, the JVMs' collections and compilations),
    and no measure may pay for another one's leftovers."""
    started = time.monotonic()
    while (busy := psutil.cpu_percent(interval=2)) > idle_pct:
        if time.monotonic() - started > longest_s:
            print(f"  (the machine is still {busy:.0f}% busy after {longest_s:.0f}s; measuring anyway)", flush=True)
            return


def row(name: str, value: float, unit: str, detail: str = "", cpu: float | None = None, records: int | None = None,
        **extra) -> dict:
    """Record a measure; measured again (--repeat), its row keeps the best value and every sample. `cpu`: the
    CPU seconds its own processes used, over `records` records; the row keeps the least of its rounds
    (`cpu_least`, and per million records `cpu_per_million`)."""
    entry = {"name": name, "value": round(value, 3), "unit": unit, "load": load(), "detail": detail, **extra}
    if records is not None:
        entry["records"] = records
    if cpu is not None:
        entry["cpu_s"] = round(cpu, 2)
        detail += f"; CPU {cpu:.2f} s" + (f", {cpu / (records / 1e6):.2f} s per 1M records" if records else "")
    print(f"  {name}: {value:,.2f} {unit} {detail} (load {entry['load']})", flush=True)
    previous = next((r for r in ROWS if r["name"] == name), None)
    if previous is None:
        ROWS.append(entry | {"samples": [entry["value"]]})
        previous = ROWS[-1]
    else:
        previous["samples"].append(entry["value"])
        if (value > previous["value"]) if unit == "records/s" else (value < previous["value"]):
            previous.update(entry)
    if cpu is not None:
        previous["cpu_least"] = round(min(cpu, previous.get("cpu_least", cpu)), 2)
        if records:
            previous["cpu_per_million"] = round(previous["cpu_least"] / (records / 1e6), 2)
    return previous


def worst_round(ours: list[float], theirs: list[float]) -> float:
    """Their seconds over ours, round by round (the lists in round order): the lowest, for a target that
    must hold in every round and not only between the best ones."""
    return min(t / o for o, t in zip(ours, theirs, strict=True))


def chart_point(system: str, records: int, seconds: float, measured: dict) -> None:
    """`system`'s point at `records` in both of the chart's panels: its best seconds (CURVE) and the least CPU
    seconds of `measured`'s rounds (a row; CPU), each the best of those recorded for that size."""
    CURVE[system][records] = min(seconds, CURVE[system].get(records, seconds))
    CPU[system][records] = min(measured["cpu_least"], CPU[system].get(records, measured["cpu_least"]))


def delete_topics(kafka: dict, prefix: str) -> None:
    """The bench's topics go when it ends: millions of records left behind would fill the local home's disk
    run after run."""
    admin = AdminClient(kafka)
    mine = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
    for future in admin.delete_topics(mine, operation_timeout=60).values() if mine else []:
        future.result()


def report(targets: list[tuple], path: Path, run: dict) -> None:
    """Print every measure (its best round) and every target's value with PASS or FAIL, and write them with
    `run` (the arguments, the parts) as JSON to `path`."""
    print(f"\n{'measure (best of its rounds)':<40} {'value':>14}  {'unit':<10} {'CPU s/1M':>8} {'rounds':>6}  load\n"
          + "-" * 101)
    for r in ROWS:
        cpu = f"{r['cpu_per_million']:>8,.2f}" if "cpu_per_million" in r else " " * 8
        print(f"{r['name']:<40} {r['value']:>14,.2f}  {r['unit']:<10} {cpu} {len(r['samples']):>6}  {r['load']}")
    print(f"\n{'target':<58} {'ratio':>8}  result\n" + "-" * 78)
    results = []
    for name, value, limit, op in targets:
        ok = value >= limit if op == ">=" else value <= limit
        results.append({"target": name, "value": round(value, 3), "pass": ok})
        print(f"{name:<58} {value:>8.2f}  {'PASS' if ok else 'FAIL'}")
    for part, error in run.get("failed_parts", {}).items():
        print(f"{'part ' + part + ' failed: its targets are missing':<58} {'':>8}  FAIL ({error})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**run, "cores": os.cpu_count(), "measures": ROWS, "targets": results,
                                "curve": CURVE, "cpu": CPU}, indent=2, default=str))
    print(f"\nwritten to {path}")
