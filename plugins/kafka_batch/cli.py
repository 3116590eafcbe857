"""`kafka-batch`: the operator's command line over the same code as the DAGs.

Connections come from the environment (`AIRFLOW_CONN_*`, as in the DAGs); `kafka-batch local up`
starts the embedded services and writes them to `.local/env.sh`.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from kafka_batch import batches, connections, offset_store, submit
from kafka_batch.config import load_pipeline
from kafka_batch.kafka_source import KafkaOffsets


def _services(pipeline):
    postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
    kafka = KafkaOffsets(connections.kafka_config(connections.from_environment(pipeline.connections.kafka)))
    return offset_store.connect(postgres), kafka


def submit_batch(pipeline, batch_id: int) -> None:
    """spark-submit the batch through the same hook the DAG's operator uses."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    env = {
        **submit.spark_environment(),
        **submit.connection_environment(
            connections.from_environment(pipeline.connections.postgres),
            connections.from_environment(pipeline.connections.kafka),
        ),
    }
    hook = SparkSubmitHook(
        conn_id=pipeline.connections.spark,
        conf=dict(submit.SPARK_CONF),
        py_files=str(submit.package_zip()),
        name=f"kafka_batch_{pipeline.name}",
        application_args=submit.application_args(pipeline, batch_id),
        env_vars=env,
    )
    hook.submit(str(submit.APPLICATION))


def cmd_plan(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, kafka = _services(pipeline)
    try:
        if args.dry_run:
            batches.prepare(conn, pipeline)
            with offset_store.transaction(conn) as cur:
                states, _ = batches.partition_states(cur, kafka, pipeline)
            ranges = batches.next_ranges(states, pipeline)
            print(f"dry run: {len(ranges)} ranges, {sum(r.span for r in ranges)} offsets (nothing persisted)")
            for r in ranges:
                print(f"  {r}")
            return 0
        batch = batches.plan_batch(conn, kafka, pipeline, run_id=args.run_id or _cli_run_id())
        print(json.dumps(batch.summary(), indent=2))
    finally:
        conn.close()
    return 0


def _cli_run_id() -> str:
    return "cli__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def cmd_run(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, kafka = _services(pipeline)
    try:
        batch = batches.plan_batch(conn, kafka, pipeline, run_id=args.run_id or _cli_run_id())
        print(f"batch {batch.id} ({batch.status}): {len(batch.ranges)} ranges, {batch.span} offsets")
        if batch.status in ("planned", "failed"):
            submit_batch(pipeline, batch.id)
        summary = batches.report(conn, kafka, pipeline, batch.id)
    finally:
        conn.close()
    print(f"batch {summary['batch_id']} {summary['status']}: {summary['records_read']} records; lag {summary['lag']}")
    return 0


def cmd_status(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, kafka = _services(pipeline)
    try:
        rows = batches.status(conn, kafka, pipeline)
    finally:
        conn.close()
    print(batches.format_status(rows))
    return 0


def cmd_local(args) -> int:
    from kafka_batch import local_stack

    return local_stack.main([args.action])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-batch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan and persist the next batch (or --dry-run: only show it)")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--run-id", help="the run that owns the batch; the same id returns the same batch")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("run", help="plan, execute with Spark and commit one batch")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--run-id", help="re-run the batch of this run id (a committed batch is a no-op)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", help="per partition: position, last stable offset, lag, last batch")
    p.add_argument("--pipeline", required=True)
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("local", help="start/stop the embedded local services")
    p.add_argument("action", choices=["up", "down", "env"])
    p.set_defaults(func=cmd_local)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # one clear line for operators; tracebacks are for the logs of the job
        from kafka_batch.config import ConfigError
        from kafka_batch.connections import ConnectionConfigError
        from kafka_batch.kafka_source import KafkaSourceError
        from kafka_batch.offset_store import BatchError
        from kafka_batch.planner import PlanError

        if isinstance(exc, (ConfigError, ConnectionConfigError, KafkaSourceError, BatchError, PlanError)):
            print(f"kafka-batch: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
