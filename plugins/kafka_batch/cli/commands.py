"""`kafka-batch`: the operator's command line over the same code as the DAGs.

Connections come from the environment (`AIRFLOW_CONN_*`, as in the DAGs); `kafka-batch local up`
starts the embedded services and writes them to `.local/env.sh`.
"""

from __future__ import annotations

import argparse
import gc
import getpass
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
from confluent_kafka import KafkaException
from tabulate import tabulate

from kafka_batch import connections, installed_version
from kafka_batch.config import load_pipeline, load_pipelines, log_dir, optional_time_ms
from kafka_batch.core import database, inspection, kafka_checks, planning, quarantine, report, resets
from kafka_batch.core.planning import OffsetRequest
from kafka_batch.errors import InputError, KafkaBatchError, ServiceError, UnsafeBroker, one_line
from kafka_batch.kafka.source import LIBRDKAFKA_LOG, KafkaOffsets, first_timestamps
from kafka_batch.observability import metrics, timings
from kafka_batch.spark.execution import batch_execution

# `status --check`'s exit status when the pipeline is behind its alerts (errors keep theirs: errors.py).
BEHIND = 7
SHOWN_PARTITIONS = 12  # `status` lists a pipeline's partitions when it has at most this many


def _postgres(conn_id: str):
    """A session on the Postgres of this connection id."""
    return database.connect(connections.postgres_params(connections.from_environment(conn_id)))


def _kafka_config(pipeline) -> dict:
    return connections.kafka_config(connections.from_environment(pipeline.connections.kafka))


def _publish_config(pipeline) -> dict | None:
    """The Kafka connection the pipeline's Kafka sink publishes on (`connections.kafka_output`, or `kafka`);
    None without a Kafka sink."""
    if not pipeline.publishing_sinks:
        return None
    return connections.kafka_config(connections.from_environment(pipeline.connections.publish))


def _services(pipeline):
    kafka = KafkaOffsets(_kafka_config(pipeline), timeout=pipeline.read.kafka_timeout_seconds)
    return _postgres(pipeline.connections.postgres), kafka


def submit_batch(pipeline, batch_id: int, mode: str = "commit", verbose: bool = True) -> None:
    """Execute the batch the way the DAG's operator does (spark-submit, or Spark Connect). Unless
    `verbose`, Spark's output goes to a file and only the job's own lines (what it does, its progress)
    are shown."""
    timings.mark("submit_prepare")
    postgres = connections.from_environment(pipeline.connections.postgres)
    kafka = connections.from_environment(pipeline.connections.kafka)
    spark, registry = _spark_connection(pipeline), _registry_connection(pipeline)
    output = None
    if pipeline.publishing_sinks and pipeline.connections.kafka_output:
        output = connections.from_environment(pipeline.connections.kafka_output)
    with _spark_output(pipeline.name, batch_id, verbose) as logger, \
            batch_execution(pipeline, batch_id, postgres, kafka, spark, registry=registry, output=output, mode=mode,
                            log=logger) as execution:
        timings.mark("submit_start")
        execution.run()
        timings.mark("submit_done")


def _spark_connection(pipeline) -> connections.ConnectionFields | None:
    try:
        return connections.from_environment(pipeline.connections.spark)
    except KafkaBatchError:  # undefined: spark-submit with its defaults, as the provider's hook does
        return None


def _registry_connection(pipeline) -> connections.ConnectionFields | None:
    if not pipeline.uses_registry:
        return None
    return connections.from_environment(pipeline.connections.schema_registry)


def _analyze(conn, pipeline) -> None:
    """The definition's expressions resolved by Spark's analyzer before anything is planned (once for each
    record layout and set of expressions: kafka_batch.spark.analysis)."""
    from kafka_batch.spark import analysis

    analysis.check_expressions(conn, pipeline, _spark_connection(pipeline), _registry_connection(pipeline))


_JOB_LINE = re.compile(r"\bkafka_batch\.job: (.*)$")


class _JobLines(logging.Handler):
    """Shows the Spark job's own log lines on the terminal (the rest stays in the file): from
    spark-submit's output, or from the job itself when it runs in this process (Spark Connect)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "kafka_batch.job":
            print(f"  {record.getMessage()}", flush=True)
            return
        match = _JOB_LINE.search(record.getMessage())
        if match:
            print(f"  {match.group(1)}", flush=True)


_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def _spark_output(pipeline_name: str, batch_id: int, verbose: bool) -> Iterator[logging.Logger | None]:
    """A logger writing spark-submit's output to a file under KAFKA_BATCH_LOG_DIR (default: the temp
    directory) and showing the job's lines; None (Airflow's logging, on the terminal) when `verbose`.
    The project's own loggers (the job's, under Spark Connect) go the same way."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
        yield None
        return
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{pipeline_name}-batch-{batch_id}-{datetime.now(UTC):%Y%m%dT%H%M%S}.log"
    to_file, in_process_to_file = logging.FileHandler(path), logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter("%(message)s"))  # spark-submit's lines are formatted already
    in_process_to_file.setFormatter(logging.Formatter(_LOG_FORMAT))
    logger = logging.getLogger(f"kafka_batch.cli.commands.spark_submit.{batch_id}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.handlers = [to_file, _JobLines()]
    project = logging.getLogger("kafka_batch")
    saved = project.handlers, project.level, project.propagate
    project.handlers, project.propagate = [in_process_to_file, _JobLines()], False
    project.setLevel(logging.INFO)
    # pyspark's own (a Spark Connect batch runs here): each error it raises, logged with its traces.
    from kafka_batch.spark.analysis import pyspark_error_loggers

    spark_loggers = pyspark_error_loggers()
    spark_saved = [spark_logger.handlers for spark_logger in spark_loggers]
    for spark_logger in spark_loggers:
        spark_logger.handlers = [in_process_to_file]
    print(f"Spark's log: {path} (--verbose shows it here)", flush=True)
    try:
        yield logger
    except KafkaBatchError as exc:  # its one line names where the trace is
        raise type(exc)(f"{exc} (Spark's log: {path})") from None
    finally:
        logger.handlers = []
        for spark_logger, handlers in zip(spark_loggers, spark_saved, strict=True):
            spark_logger.handlers = handlers
        project.handlers, project.propagate = saved[0], saved[2]
        project.setLevel(saved[1])
        to_file.close()
        in_process_to_file.close()


def cmd_plan(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, kafka = _services(pipeline)
    try:
        _analyze(conn, pipeline)
        if args.dry_run:
            plan = planning.dry_run(conn, kafka, pipeline)
            print(f"dry run: {len(plan['ranges'])} ranges, {plan['offsets_planned']} offsets, lag {plan['lag']}"
                  " (nothing persisted)")
            for r in plan["ranges"]:
                print(f"  {r['topic']}[{r['partition']}] {r['from_offset']}..{r['until_offset']}")
            return 0
        batch = planning.plan_batch(conn, kafka, pipeline, run_id=args.run_id or _cli_run_id(),
                                     publish_config=_publish_config(pipeline))
        print(json.dumps(batch.summary(), indent=2))
    finally:
        conn.close()
    return 0


def cmd_validate(args) -> int:
    """The pipeline's file and its expressions, checked as its first plan checks them (Spark's analyzer,
    kafka_batch.spark.analysis); nothing is planned. Postgres remembers a verdict that passed."""
    pipeline = load_pipeline(args.pipeline)
    conn = _postgres(pipeline.connections.postgres)
    try:
        _analyze(conn, pipeline)
    finally:
        conn.close()
    print(f"pipeline {pipeline.name} ({pipeline.source}): valid; its {len(pipeline.expressions())} expressions resolve")
    return 0


def _cli_run_id() -> str:
    return "cli__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def _execute(pipeline, batch, kafka: KafkaOffsets, mode: str = "commit", verbose: bool = True,
             planned_in: float | None = None) -> dict:
    """spark-submit a batch that still has to run (a committed one is left alone), then report it, with
    its ranges and the wall-clock seconds of the run; `kafka`: the planning's client, asked again. Its
    metrics (and `planned_in`, the seconds its planning took) go where AIRFLOW__METRICS__* say.

    The report opens its own connection: one held idle through a long Spark run may have been dropped.
    """
    started = time.monotonic()
    stats = metrics.from_environment()
    if batch.runnable:
        try:
            submit_batch(pipeline, batch.id, mode, verbose)
        except KafkaBatchError as exc:
            metrics.send(stats, metrics.failure_points(pipeline.name, batch.kind, exc))
            raise
    seconds = time.monotonic() - started
    conn = _postgres(pipeline.connections.postgres)
    try:
        summary = {**report.report(conn, kafka, pipeline, batch.id), "seconds": seconds,
                   "range_counts": inspection.batch_ranges(conn, batch.id)}
        planning_points = [] if planned_in is None else metrics.plan_points(pipeline.name, batch.kind, planned_in)
        # A batch committed before this command (a run id given again) was counted when it committed.
        metrics.observe_batch(stats, conn, kafka, _kafka_config(pipeline), pipeline,
                              batch.id if batch.runnable else None, planning_points)
        return summary
    finally:
        conn.close()


def _print_ranges(summary: dict) -> None:
    """The summary table of a run: what each range read."""
    rows = [(r["topic"], r["partition"], r["from_offset"], r["until_offset"], r["records_read"],
             r["records_tombstone"], r["records_invalid"]) for r in summary["range_counts"]]
    if rows:
        print(tabulate(rows, headers=["topic", "partition", "from", "until", "records", "tombstones", "invalid"],
                       missingval="-"))


def cmd_run(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, kafka = _services(pipeline)
    try:
        _analyze(conn, pipeline)
        timings.mark("plan_start")
        started = time.monotonic()
        batch = planning.plan_batch(conn, kafka, pipeline, run_id=args.run_id or _cli_run_id(),
                                     publish_config=_publish_config(pipeline))
        planned_in = time.monotonic() - started
        timings.mark("plan_done")
    finally:
        conn.close()
    print(f"batch {batch.id} ({batch.status}): {len(batch.ranges)} ranges, {batch.span} offsets")
    summary = _execute(pipeline, batch, kafka, verbose=args.verbose, planned_in=planned_in)
    _print_ranges(summary)
    invalid = summary["records_invalid"]
    quarantined = f", {invalid} quarantined (kafka-batch quarantine --pipeline {pipeline.name})" if invalid else ""
    records = summary["records_read"] or 0
    rate = f" in {summary['seconds']:.0f} s ({records / summary['seconds']:,.0f} records/s)" if batch.runnable else ""
    lag = summary["lag"] if summary["lag"] is not None else f"unknown ({summary['lag_error']})"
    print(f"batch {summary['batch_id']} {summary['status']}: {records} records{rate}{quarantined}; lag {lag}")
    return 0


def _partition_list(text: str) -> tuple[int, ...]:
    """`0,2,5` -> (0, 2, 5); anything else is one clear argparse error, not a traceback."""
    try:
        partitions = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated partition numbers, got {text!r}") from None
    if any(p < 0 for p in partitions):
        raise argparse.ArgumentTypeError(f"partition numbers are >= 0, got {text!r}")
    return partitions


def _whole_number(what: str, minimum: int):
    """An argparse type: a whole number >= minimum, else one clear error line naming `what`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} is a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} is >= {minimum}, got {value}")
        return value

    return parse


_offset = _whole_number("an offset", 0)
_count = _whole_number("a count", 1)


def _offset_request(args, *, target: bool = False) -> OffsetRequest:
    partitions = args.partitions or ()
    if target:
        return OffsetRequest(args.topic, partitions, from_offset=args.to_offset,
                             from_time_ms=optional_time_ms(args.to_time, "--to-time"))
    return OffsetRequest(
        args.topic, partitions, args.from_offset, args.until_offset,
        optional_time_ms(args.from_time, "--from-time"), optional_time_ms(args.until_time, "--until-time"),
    )


def cmd_replay(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    request = _offset_request(args)
    conn, kafka = _services(pipeline)
    try:
        batch = planning.plan_replay(
            conn, kafka, pipeline, request, run_id=args.run_id or "replay__" + _cli_run_id(), requested_by=args.by,
            reason=args.reason,
        )
    finally:
        conn.close()
    print(f"{'dry run: would recompute' if args.dry_run else 'recomputing'} {len(batch.ranges)} committed range(s)"
          " (the request widened to whole ranges):")
    for r in batch.ranges:
        print(f"  {r}")
    summary = _execute(pipeline, batch, kafka, "preview" if args.dry_run else "commit", verbose=args.verbose)
    if args.dry_run:
        print(f"replay {summary['batch_id']} previewed, nothing committed; {len(summary['preview'])} group key(s)"
              " would change (before -> after):")
        for row in summary["preview"]:
            print(f"  {row['table']} {json.dumps(row['group_key'])}: {json.dumps(row['before'])} -> {json.dumps(row['after'])}")
        return 0
    _print_ranges(summary)
    print(f"replay batch {summary['batch_id']} {summary['status']}: {summary['records_read']} records recomputed")
    return 0


def cmd_reset(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    request = _offset_request(args, target=True)
    conn, kafka = _services(pipeline)
    try:
        moves = resets.reset_positions(
            conn, kafka, pipeline, request, requested_by=args.by, reason=args.reason, dry_run=not args.execute,
            kafka_config=_publish_config(pipeline),
        )
        if args.execute:
            metrics.send(metrics.from_environment(), metrics.reset_points(pipeline.name, moves))
            _announce_rewind(conn, pipeline, moves)
    finally:
        conn.close()
    for move in moves:
        print(f"  {move}")
    print("dry run: nothing changed; add --execute to apply" if not args.execute else "applied and recorded")
    return 0


def _announce_rewind(conn, pipeline, moves) -> None:
    """The rewind's lineage event, when OpenLineage is configured (its client is imported only then)."""
    if not any(move.direction == "rewind" for move in moves):
        return
    from kafka_batch.observability import lineage

    client = lineage.client_from_environment()
    if client is not None:
        postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
        lineage.emit_rewind(client, pipeline, _kafka_config(pipeline), postgres, moves,
                            report.table_columns(conn, pipeline.tables))


def cmd_status(args) -> int:
    if args.all:
        return _status_all(args)
    pipeline = load_pipeline(args.pipeline)
    alerts = pipeline.alerts
    if args.check and alerts.max_lag_records is None and alerts.max_lag_seconds is None:
        raise InputError(f"pipeline {pipeline.name} defines no alerts (alerts: max_lag_records, max_lag_seconds in"
                         f" {pipeline.source}): --check has nothing to check")
    conn, kafka = _services(pipeline)
    try:
        rows = report.status(conn, kafka, pipeline)
    finally:
        conn.close()
    sinks = []
    if pipeline.publishing_sinks:
        from kafka_batch.kafka.publish import sink_states

        sinks = sink_states(_publish_config(pipeline), pipeline, [(r.topic, r.partition) for r in rows])
    lag = sum(r.lag for r in rows)
    breaches = []
    if args.check:
        lagging = {(r.topic, r.partition): r.position for r in rows if r.lag} if alerts.max_lag_seconds else {}
        found = [ms for ms in first_timestamps(_kafka_config(pipeline), lagging).values() if ms is not None]
        oldest = datetime.fromtimestamp(min(found) / 1000, UTC) if found else None
        breaches = alerts.breaches(lag, oldest, datetime.now(UTC))
    topics = report.topic_totals((r.topic, r.partition, r.lag, r.last_batch_id) for r in rows)
    if args.json:
        print(json.dumps({"pipeline": pipeline.name, "lag": lag, "topics": [asdict(t) for t in topics],
                          "partitions": [asdict(r) for r in rows], **({"kafka_sinks": sinks} if sinks else {}),
                          **({"breaches": breaches} if args.check else {})}, indent=2, default=str))
    else:
        print(tabulate(
            [(t.topic, t.partitions, t.lag, t.behind, ", ".join(f"{p} ({n:,})" for p, n in t.worst) or "-",
              "-" if t.last_batch_id is None else t.last_batch_id) for t in topics],
            headers=["topic", "partitions", "lag", "behind", "most behind (lag)", "last batch"],
        ))
        if args.partitions or len(rows) <= SHOWN_PARTITIONS:
            print()
            print(tabulate(
                [(r.topic, r.partition, r.position, r.last_stable, r.lag,
                  "-" if r.last_batch_id is None else r.last_batch_id) for r in rows],
                headers=["topic", "partition", "position", "last stable", "lag", "last batch"],
            ))
        else:
            print(f"({len(rows):,} partitions: `--partitions` lists each)")
        for sink in sinks:
            last = sink["last_published"]
            print(f"kafka sink {sink['topic']}: last batch published {'-' if last is None else last['batch_id']}")
            for t in sink["open_transactions"]:
                age = "" if t["since"] is None else f", open {(datetime.now(UTC) - t['since']).total_seconds():.0f} s"
                print(f"  partition {t['partition']}: an open transaction holds readers at offset {t['stable']}"
                      f" (end {t['end']}{age}); `kafka-batch fence --pipeline {pipeline.name}` aborts ours")
    if breaches:
        print(f"kafka-batch: pipeline {pipeline.name} is behind: {'; '.join(breaches)}", file=sys.stderr)
        return BEHIND
    return 0


def _status_all(args) -> int:
    """Every pipeline of the folder, a line each (the console's overview, inspection.overview): pipelines
    that share their Postgres and Kafka connections share one session and one client, and the oldest
    unread record is asked only where alerts bound its age. A pipeline whose services fail, or whose
    file is invalid, gets its error on its line; with --check, any problem or pipeline behind exits BEHIND."""
    invalid: dict[str, str] = {}
    lines = []
    failing = (KafkaBatchError, psycopg2.Error, KafkaException)
    for pipelines in inspection.sharing_connections(load_pipelines(invalid=invalid).values()):
        try:
            conn, kafka = _services(pipelines[0])
        except failing as exc:
            lines += [{"pipeline": p, "error": exc} for p in pipelines]
            continue
        try:
            database.apply_migrations(conn)  # as `status` of one pipeline does
            lines += inspection.overview(conn, kafka, _kafka_config(pipelines[0]), pipelines, oldest_unread=False)
        except failing as exc:  # the group's Postgres (each pipeline's own failures are on its line already)
            lines += [{"pipeline": p, "error": exc} for p in pipelines]
        finally:
            conn.close()
    lines = [{**line, "pipeline": line["pipeline"].name, "topics": line["pipeline"].topics_label,
              "error": next((one_line(e) for e in (line.get("error"), line.get("kafka_error")) if e), None)}
             for line in lines]
    lines.sort(key=lambda line: line["pipeline"])
    lines += [{"pipeline": None, "file": path, "error": f"invalid pipeline file: {error}"}
              for path, error in invalid.items()]
    if args.json:
        print(json.dumps({"pipelines": lines}, indent=2, default=str))
    else:
        print(tabulate([_status_line(line) for line in lines],
                       headers=["pipeline", "topics", "partitions", "lag", "behind", "last batch", "last commit",
                                "needs a look"]))
    needing = sum(1 for line in lines if line["error"] or line.get("behind"))
    if args.check and needing:
        print(f"kafka-batch: {needing} pipeline(s) need a look", file=sys.stderr)
        return BEHIND
    return 0


def _status_line(line: dict) -> tuple:
    if line["pipeline"] is None:
        return (f"({Path(line['file']).name})", "-", "-", "-", "-", "-", "-", line["error"])
    last = line.get("last_batch")
    problems = [line["error"]] if line["error"] else []
    problems += line.get("behind") or []
    problems += [f"{line[key]} {what}" for key, what in (("failed_batches", "failed batches"),
                 ("data_loss", "data losses"), ("quarantined", "quarantined")) if line.get(key)]
    committed = line.get("last_commit_at")
    return (line["pipeline"], line["topics"], line.get("partitions", "-"), line.get("lag", "-"),
            line.get("partitions_behind", "-"),
            line.get("not_started") or ("-" if last is None else f"{last['id']} {last['status']}"),
            "-" if committed is None else committed.strftime("%Y-%m-%d %H:%M:%S"), "; ".join(problems) or "-")


def cmd_fence(args) -> int:
    """Abort whatever transaction the pipeline's Kafka sinks left open, by fencing their transactional
    ids (a running attempt of the pipeline is fenced too: its batch fails and is retried)."""
    pipeline = load_pipeline(args.pipeline)
    sinks = pipeline.publishing_sinks
    if not sinks:
        raise InputError(f"pipeline {pipeline.name} has no Kafka sink: no transaction of it to fence")
    from kafka_batch.kafka.publish import Publisher

    for sink in sinks:
        publisher = Publisher(_publish_config(pipeline), pipeline.name, sink.topic, timeout=sink.call_timeout_seconds)
        try:
            publisher.fence()
        finally:
            publisher.close()
        line = (f"fenced {publisher.transactional_id} (pipeline {pipeline.name}, topic {sink.topic}): its open"
                f" transaction, if any, is aborted; by {args.by}: {args.reason}")
        print(line)  # the audit line: who fenced what, and why
    return 0


def cmd_batches(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, _ = _services(pipeline)
    try:
        rows = inspection.batches(conn, pipeline.name, args.last)
    finally:
        conn.close()
    if args.json:
        print(json.dumps({"pipeline": pipeline.name, "batches": rows}, indent=2, default=str))
        return 0
    print(tabulate(
        [(b["id"], b["kind"], b["status"], b["run_id"], b["try_number"], len(b["ranges"]), b["records_read"],
          b["records_invalid"], None if b["duration_s"] is None else round(b["duration_s"], 1),
          (b["error"] or "")[:60]) for b in rows],
        headers=["batch", "kind", "status", "run id", "try", "ranges", "records", "invalid", "seconds", "error"],
        missingval="-",
    ))
    return 0


def cmd_quarantine(args) -> int:
    pipeline = load_pipeline(args.pipeline)
    conn, _ = _services(pipeline)
    try:
        with database.transaction(conn) as cur:
            rows = quarantine.newest(cur, pipeline.name, args.last)
    finally:
        conn.close()
    if not rows:
        print(f"no quarantined records for pipeline {pipeline.name}")
        return 0
    print(tabulate(
        [(r["topic"], r["partition"], r["offset"], r["batch_id"], r["value_bytes"], r["reason"][:80],
          repr(r["value_start"])[:40]) for r in rows],
        headers=["topic", "partition", "offset", "batch", "bytes", "reason", "value starts"],
    ))
    first = rows[0]  # the newest batch's first invalid record
    print(f"\nAfter fixing the pipeline definition, re-process a record's range with a replay, e.g.:\n"
          f"  kafka-batch replay --pipeline {pipeline.name} --topic {first['topic']} --partitions {first['partition']}"
          f" --from {first['offset']} --until {first['offset'] + 1} --dry-run")
    return 0


def cmd_acls(args) -> int:
    """The ACLs the pipeline's Kafka users need: as kafka-acls.sh commands, or created (--apply). The
    connections are read where defined (for their users, bootstrap servers and group.id); printing needs
    none of them with --principal."""
    from kafka_batch.kafka import acls

    pipeline = load_pipeline(args.pipeline)
    sides = {False: _defined(pipeline.connections.kafka), True: _defined(pipeline.connections.publish)}
    matching: set[str] = set()
    if pipeline.topic_pattern is not None and acls.literal_prefix(pipeline.topic_pattern) is None:
        kafka = KafkaOffsets(_kafka_config(pipeline), timeout=pipeline.read.kafka_timeout_seconds)
        matching = {t for t, _ in kafka.partitions((), pipeline.topic_pattern)}
    reader_group = sides[False].extra.get("group.id") if sides[False] else None
    grants = acls.required(pipeline, matching, reader_group or acls.READER_GROUP)
    for output in sorted({g.output for g in grants}):
        conn = sides[output]
        principal = args.principal or _principal(conn, pipeline.connections.publish if output else pipeline.connections.kafka)
        mine = [g for g in grants if g.output == output]
        if args.apply:
            count = acls.apply(connections.kafka_config(connections.from_environment(args.apply)), mine, principal)
            print(f"created {count} ACL(s) for {principal} ({'output' if output else 'input'} of pipeline {pipeline.name})")
        else:
            bootstrap = conn.extra.get("bootstrap.servers", "<bootstrap>") if conn else "<bootstrap>"
            print("\n".join(acls.kafka_acls_commands(mine, principal, bootstrap)))
    return 0


def _defined(conn_id: str) -> connections.ConnectionFields | None:
    try:
        return connections.from_environment(conn_id)
    except InputError:
        return None


def _principal(conn: connections.ConnectionFields | None, conn_id: str) -> str:
    """`User:<login>` of a Kafka connection (its login, or its extra's sasl.username)."""
    user = conn and (conn.login or conn.extra.get("sasl.username"))
    if not user:
        raise InputError(f"connection {conn_id!r} is not defined or has no login (a SASL user): give the principal"
                         " with --principal")
    return f"User:{user}"


def cmd_check_kafka(args) -> int:
    if args.pipeline:
        pipeline = load_pipeline(args.pipeline)
        kafka_conn, postgres_conn = pipeline.connections.kafka, pipeline.connections.postgres
    else:
        kafka_conn, postgres_conn = args.kafka_conn, args.postgres_conn
    kafka = connections.kafka_config(connections.from_environment(kafka_conn))
    conn = _postgres(postgres_conn)
    try:
        check = kafka_checks.check_and_record(conn, kafka)
    finally:
        conn.close()
    print("\n".join(kafka_checks.describe(check)))
    return 0 if check.reads_safe else UnsafeBroker.exit_code


def cmd_local(args) -> int:
    from kafka_batch_dev import local_stack

    flags = [flag for flag, on in (("--airflow", args.airflow), ("--no-spark-connect", args.no_spark_connect)) if on]
    if args.kafka_nodes:
        flags += ["--kafka-nodes", str(args.kafka_nodes)]
    if args.kafka_security:
        flags += ["--kafka-security", args.kafka_security]
    return local_stack.main([args.action, *flags])


def cmd_schema(args) -> int:
    from kafka_batch.cli import reference

    if args.commands:
        print(reference.commands_markdown(build_parser()), end="")
    else:
        print(reference.markdown() if args.markdown else reference.schema_text(), end="")
    return 0


def _operator(given: str) -> str:
    """Who asks: `--by`, else $KAFKA_BATCH_OPERATOR, else the OS user (found when parsed, not when the
    parser is built, so the generated reference names no user)."""
    return given or os.environ.get("KAFKA_BATCH_OPERATOR") or getpass.getuser()


PIPELINE_HELP = "the pipeline's name (its file in pipelines/ or $KAFKA_BATCH_PIPELINES_DIR)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-batch", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan and persist the next batch (or --dry-run: only show it)")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.add_argument("--run-id", help="the run that owns the batch; the same id returns the same batch")
    p.add_argument("--dry-run", action="store_true", help="show the ranges the next batch would read; store nothing")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("validate", help="check the pipeline's file and resolve its expressions with Spark's analyzer,"
                                        " as its first plan does; plan nothing")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.set_defaults(func=cmd_validate)
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("--verbose", action="store_true",
                         help="show Spark's whole log here (default: in a file, with the job's progress shown)")
    p = sub.add_parser("run", parents=[verbose], help="plan, execute with Spark and commit one batch")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.add_argument("--run-id", help="re-run the batch of this run id (a committed batch is a no-op)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", help="per topic: lag and the partitions most behind; per partition: position, last"
                                      " stable offset, lag, last batch")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pipeline", help=PIPELINE_HELP)
    which.add_argument("--all", action="store_true",
                       help="every pipeline, a line each: lag, partitions behind, last batch and what needs a look")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--partitions", action="store_true",
                   help=f"list every partition (shown anyway for at most {SHOWN_PARTITIONS})")
    p.add_argument("--check", action="store_true",
                   help=f"exit {BEHIND} with one line when the lag is over the pipeline's alerts (for a cron or a probe)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("fence", help="abort the transaction the pipeline's Kafka sink left open (a killed attempt's"
                       " holds the topic's read_committed readers until it times out)")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.add_argument("--reason", required=True, help="why (in the audit line)")
    p.add_argument("--by", type=_operator, default="", help="who asks (in the audit line); default: the OS user")
    p.set_defaults(func=cmd_fence)
    p = sub.add_parser("batches", help="the newest batches: kind, status, run, ranges, records, duration, error")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.add_argument("--last", type=_count, default=20, help="how many, newest first; default 20")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_batches)
    p = sub.add_parser("quarantine", help="records the pipeline could not process, with their reasons")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.add_argument("--last", type=_count, default=50, help="how many (newest batches first); default 50")
    p.set_defaults(func=cmd_quarantine)
    # What replay and reset both act on, and who asks.
    partitions = argparse.ArgumentParser(add_help=False)
    partitions.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    partitions.add_argument("--topic", required=True, help="one of the topics the pipeline reads")
    partitions.add_argument("--partitions", type=_partition_list,
                            help="comma-separated; default: every partition the pipeline has read")
    partitions.add_argument("--by", type=_operator, default="", help="who asks (recorded); default: the OS user")
    p = sub.add_parser("replay", parents=[partitions, verbose],
                       help="recompute committed ranges and swap their contributions (positions stay)")
    p.add_argument("--from", dest="from_offset", type=_offset, help="the first offset to replay")
    p.add_argument("--until", dest="until_offset", type=_offset, help="the offset after the last one to replay")
    p.add_argument("--from-time", help="ISO 8601 with a time zone, instead of --from/--until")
    p.add_argument("--until-time", help="ISO 8601 with a time zone, instead of --until")
    p.add_argument("--reason", default="replay", help="why (recorded with the replay)")
    p.add_argument("--run-id", help="the replay's id; the same id resumes the same replay")
    p.add_argument("--dry-run", action="store_true",
                   help="recompute and store per key what would change (kafka_batch.replay_previews); change nothing")
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("reset", parents=[partitions],
                       help="move positions back (rewind) or forward (skip); dry run unless --execute")
    p.add_argument("--to-offset", type=_offset, help="the offset each chosen partition's position moves to")
    p.add_argument("--to-time", help="ISO 8601 with a time zone: the first offset at or after it")
    p.add_argument("--reason", required=True, help="why (kept in kafka_batch.resets)")
    p.add_argument("--execute", action="store_true", help="apply the reset (default: show it only)")
    p.set_defaults(func=cmd_reset)
    p = sub.add_parser("acls", help="the Kafka ACLs the pipeline's users need (least privilege): kafka-acls.sh"
                       " commands to paste, or created through the admin API with --apply")
    p.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    p.add_argument("--principal", help="whom to allow, e.g. User:etl; default: User:<login> of the pipeline's Kafka"
                   " connection (and of connections.kafka_output for a Kafka sink's)")
    p.add_argument("--apply", metavar="CONN_ID", help="create the ACLs, logged in with this Kafka connection (a user"
                   " allowed Alter on the cluster); default: only print them")
    p.set_defaults(func=cmd_acls)
    p = sub.add_parser("check-kafka", help="check that a Kafka cluster's read_committed answers are right (writes"
                       " a topic of its own, then deletes it) and record the verdict batches go by")
    p.add_argument("--pipeline", help="the pipeline whose Kafka and Postgres connections to use")
    p.add_argument("--kafka-conn", default="kafka_default", help="without --pipeline: the Kafka connection id")
    p.add_argument("--postgres-conn", default="kafka_batch_postgres",
                   help="without --pipeline: where the verdict is recorded")
    p.set_defaults(func=cmd_check_kafka)
    p = sub.add_parser("local", help="start/stop the embedded local services (up --airflow: with Airflow's servers;"
                       " install: fetch Apache Kafka's broker once)")
    p.add_argument("action", choices=["install", "up", "down", "env"],
                   help="install: fetch Apache Kafka's broker (once); up, down: start or stop the services; env: print their"
                   " environment (env.sh)")
    p.add_argument("--airflow", action="store_true", help="with up: also start Airflow's api-server, scheduler, "
                   "dag-processor and triggerer on loopback")
    p.add_argument("--no-spark-connect", action="store_true", help="with up: without the Spark Connect server "
                   "(started by default on loopback as connection spark_connect_default)")
    p.add_argument("--kafka-nodes", type=int, choices=(1, 3), help="with up: Apache Kafka as one node (the default)"
                   " or a replicated cluster of three (replication factor 3, min.insync.replicas 2); default:"
                   " $KAFKA_BATCH_KAFKA_NODES, else as the local data was made")
    p.add_argument("--kafka-security", choices=("none", "sasl_ssl"), help="with up: the Kafka listener: PLAINTEXT"
                   " (none, the default) or SASL_SSL with SCRAM-SHA-512 users, a local CA and ACLs (kafka_default logs"
                   " in as its admin); default: $KAFKA_BATCH_KAFKA_SECURITY, else as the local data was made")
    p.add_argument("--spark-connect", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.set_defaults(func=cmd_local)
    p = sub.add_parser("schema", help="print the JSON Schema of a pipeline definition (for editors and CI checks)")
    p.add_argument("--markdown", action="store_true", help="print the reference of every field instead")
    p.add_argument("--commands", action="store_true", help="print the reference of every command instead")
    p.set_defaults(func=cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    timings.mark("cli_start")
    args = build_parser().parse_args(argv)
    LIBRDKAFKA_LOG.propagate = getattr(args, "verbose", False)  # errors reach the user as one line
    try:
        return args.func(args)
    except KafkaBatchError as exc:  # one clear line for operators; tracebacks are for the job's log
        print(one_line(exc), file=sys.stderr)
        return exc.exit_code
    except (psycopg2.Error, KafkaException) as exc:  # e.g. a connection dropped mid-command
        print(one_line(ServiceError(f"{type(exc).__name__}: {exc}")), file=sys.stderr)
        return ServiceError.exit_code


def console() -> None:
    """The `kafka-batch` command. Its objects are frozen before it exits: the interpreter's last garbage
    collection over everything Airflow's import created took 0.4 s of every command."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
