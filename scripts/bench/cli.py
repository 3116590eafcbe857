"""`make bench`: the project against what users would write or pick instead, side by side on the same topic
data (bench/__init__ says what each part measures). The arguments, the parts in order, the report."""

from __future__ import annotations

import argparse
import os
import tempfile
import traceback
import uuid
from pathlib import Path

from bench.chart import draw_chart
from bench.env import Env
from bench.harness import CURVE, delete_topics, load, report
from bench.parts import (
    after_abort,
    airflow_task,
    avro,
    commit,
    concurrent,
    curve,
    fixed_cost,
    json_aggregate,
    kafka_sink,
    many_keys,
    metrics,
    parse,
    scale,
    upsert,
)
from kafka_batch.config import PROJECT_ROOT

PARTS = {"json": json_aggregate.measure, "fixed": fixed_cost.measure, "airflow": airflow_task.measure,
         "metrics": metrics.measure, "commit": commit.measure, "upsert": upsert.measure,
         "many-keys": many_keys.measure, "avro": avro.measure, "after-abort": after_abort.measure,
         "kafka-sink": kafka_sink.measure, "curve": curve.measure, "scale": scale.measure, "parse": parse.measure,
         "concurrent": concurrent.measure}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3_000_000, help="the big Spark run (and the reads)")
    parser.add_argument("--small", type=int, default=1_000_000, help="the small Spark run, for the marginal rate")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--many", type=int, default=1000, help="partitions of the many-partition case")
    parser.add_argument("--many-records", type=int, default=100_000)
    parser.add_argument("--commit-rows", type=int, default=100_000)
    parser.add_argument("--fixed-records", type=int, default=1000)
    parser.add_argument("--many-keys-records", type=int, default=1_000_000)
    parser.add_argument("--many-keys-users", type=int, default=5_000_000,
                        help="users the many-keys records are spread over (5M: about 0.9 distinct keys per record)")
    parser.add_argument("--avro-records", type=int, default=3_000_000)
    parser.add_argument("--upsert-records", type=int, default=1_000_000)
    parser.add_argument("--upsert-keys", type=int, default=100_000)
    parser.add_argument("--upsert-commit-keys", type=int, default=100_000)
    parser.add_argument("--after-abort-records", type=int, default=1_000_000)
    parser.add_argument("--scale-records", type=int, default=1_000_000,
                        help="the scale part's big batch, over --many partitions and over 4")
    parser.add_argument("--publish-big", type=int, default=10_000_000,
                        help="the Kafka sink's big batch, for the driver's memory against the small size's")
    parser.add_argument("--pipelines", type=int, default=200, help="pipeline files of the parse part")
    parser.add_argument("--concurrent", type=int, default=20, help="pipelines started together (concurrent part)")
    parser.add_argument("--concurrent-records", type=int, default=20_000,
                        help="records added to each topic of the concurrent part before each round")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of each part's measures; each figure is its best round")
    parser.add_argument("--curve", default="1000,10000,100000",
                        help="the chart's smaller batch sizes (the json part adds --small and --records)")
    parser.add_argument("--chart", type=Path, default=PROJECT_ROOT / "docs" / "benchmarks.png",
                        help="where the chart of records per second against batch size goes")
    parser.add_argument("--only", help=f"comma-separated parts ({', '.join(PARTS)}); their targets only")
    parser.add_argument("--json", type=Path, default=Path(os.environ.get("KAFKA_BATCH_HOME", PROJECT_ROOT / ".local"))
                        / "bench.json")
    args = parser.parse_args()
    if args.small >= args.records:
        parser.error(f"--small ({args.small}) must be below --records ({args.records}): the marginal rate is their difference")

    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    pipelines = Path(tempfile.mkdtemp(prefix="kafka_batch_bench_"))
    os.environ["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines)
    env = Env(prefix, pipelines)
    print(f"kafka-batch bench {prefix}: {os.cpu_count()} cores, load {load()}", flush=True)
    try:
        return measure(args, env)
    finally:
        delete_topics(env.kafka, prefix)


def measure(args: argparse.Namespace, env: Env) -> int:
    """Run the parts `--only` names (default: every one), then print and write their results; a part that
    fails is named in the report (and the exit code), the others' results are kept."""
    chosen = args.only.split(",") if args.only else list(PARTS)
    unknown = set(chosen) - set(PARTS)
    if unknown:
        raise SystemExit(f"--only: no part {', '.join(sorted(unknown))} (parts: {', '.join(PARTS)})")
    targets, failed = [], {}
    for part in chosen:
        try:
            targets += PARTS[part](args, env)
        except Exception as error:  # a part that fails must not cost the other parts' figures
            traceback.print_exc()
            failed[part] = f"{type(error).__name__}: {error}"
            print(f"bench: part {part} failed ({failed[part]}); going on with the next", flush=True)
    report(targets, args.json, {"args": vars(args) | {"json": str(args.json)}, "parts": chosen,
                                "failed_parts": failed})
    if CURVE:
        draw_chart(args.chart)
    env.drop_tables()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
