"""DAG wiring, and nothing else: plan -> execute (spark-submit) -> report.

Each task calls the same functions as the CLI; the DAG adds only scheduling, retries and XCom.
Errors that a retry cannot mend (bad input, a lost race, data loss) fail the task at once.

The tasks are classic operators over module functions bound to their pipeline, made outside the DAG
and then added (`_add_tasks`), not `@task` closures made inside it: Airflow deep-copies the DAG's
params at every constructor level of a task made inside it (three or four for a decorated one), which
made a folder of 200 pipelines parse in twice the time.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Param, TriggerRule, task
from airflow.sdk.exceptions import AirflowFailException

from kafka_batch.airflow.operators import BatchSparkSubmitOperator, airflow_stats
from kafka_batch.config import Pipeline, invalid_dag_id, load_pipelines
from kafka_batch.errors import InputError, KafkaBatchError
from kafka_batch.observability import metrics

log = logging.getLogger(__name__)

DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(minutes=1)}
START_DATE = datetime(2024, 1, 1, tzinfo=UTC)
# Airflow checks a scheduled DAG's params against their JSON Schema's metaschema on every parse; against
# draft 7's it costs a third of the default (2020-12, all $refs), a tenth of a 200-pipeline folder's parse.
_DRAFT = {"$schema": "http://json-schema.org/draft-07/schema#"}
_LIMIT = {**_DRAFT, "type": ["null", "integer"], "minimum": 1}


# What a run of the scheduled DAG reads, by `plan_by`: its docs in the UI say it, and a backfill does it.
PLAN_BY_DOCS = {
    "offsets": ("**Plans by offsets.** Each run reads the records after the committed positions, up to the "
                "limits, whatever its data interval. Airflow's Backfill is refused (each run would read the "
                "next records, not its interval's): to recompute committed records use `{replay}` (offsets or "
                "times), or define the pipeline with `plan_by: time`."),
    "time": ("**Plans by time.** Each run reads the records before the end of its data interval, from the "
             "committed positions. A Backfill reads the intervals not read yet, in order, and recomputes those "
             "already committed (their runs again, or the committed ranges that overlap them: a replay, never "
             "counted twice), with the definition in force."),
}


def _is_backfill(dag_run) -> bool:
    return dag_run is not None and str(getattr(dag_run.run_type, "value", dag_run.run_type)) == "backfill"


def _refuse_offsets_backfill(pipeline: Pipeline, backfill: bool) -> None:
    """A backfill run of a pipeline planned by offsets: one line that says what to use instead."""
    if pipeline.plan_by != "offsets" or not backfill:
        return
    raise InputError(
        f"pipeline {pipeline.name!r} plans by offsets: a run reads the records after the committed positions"
        " whatever its data interval, so a backfill would not recompute its intervals; to recompute committed"
        f" records trigger {pipeline.replay_dag_id} (offsets or times), or define the pipeline with plan_by: time")


def batch_params() -> dict[str, Param]:
    """A scheduled DAG's params, new for each DAG: a run's values are resolved into the DAG's own Param
    objects (its tasks hold no copies: _add_tasks), so no two DAGs may share them."""
    return {
        "dry_run": Param(False, **_DRAFT, type="boolean",
                         description="Plan and report the ranges, lag and offsets; change nothing."),
        "recompute": Param(False, **_DRAFT, type="boolean",
                           description="If this run's batch is already committed, recompute (replay) its ranges."),
        "max_records_per_partition": Param(None, **_LIMIT, description="At most this many records of each"
                                           " partition in this run (e.g. 100000); empty: the pipeline's limit."),
        "max_records_per_batch": Param(None, **_LIMIT, description="At most this many records in this run (e.g."
                                       " 1000000); empty: the pipeline's limit."),
    }


def _kafka_config(pipeline: Pipeline) -> dict:
    from kafka_batch import connections

    return connections.kafka_config(connections.from_airflow(pipeline.connections.kafka))


def _publish_config(pipeline: Pipeline) -> dict | None:
    """The cluster the pipeline's Kafka sink publishes on (`connections.kafka_output`, or `kafka`); None
    without a Kafka sink."""
    from kafka_batch import connections

    if not pipeline.publishing_sinks:
        return None
    return connections.kafka_config(connections.from_airflow(pipeline.connections.publish))


def _services(pipeline: Pipeline):
    from kafka_batch import connections
    from kafka_batch.core import database
    from kafka_batch.kafka.source import KafkaOffsets

    postgres = connections.postgres_params(connections.from_airflow(pipeline.connections.postgres))
    kafka = KafkaOffsets(_kafka_config(pipeline), timeout=pipeline.read.kafka_timeout_seconds)
    return database.connect(postgres), kafka


def _analyze(conn, pipeline: Pipeline) -> None:
    """The definition's expressions resolved by Spark's analyzer before anything is planned (once for each
    record layout and set of expressions: kafka_batch.spark.analysis), on the Spark the execute task would use."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from kafka_batch import connections
    from kafka_batch.spark import analysis

    try:
        spark = connections.from_airflow(pipeline.connections.spark)
    except AirflowNotFoundException:  # spark-submit with its defaults, as the execute task's hook does
        spark = None
    registry = connections.from_airflow(pipeline.connections.schema_registry) if pipeline.uses_registry else None
    analysis.check_expressions(conn, pipeline, spark, registry)


def _observe(pipeline: Pipeline, conn, kafka, batch_id: int | None, extra=()) -> None:
    """The batch's metrics (None: only the lag) through Airflow's Stats, when Airflow's metrics are on."""
    stats = airflow_stats()
    if stats is not None:
        metrics.observe_batch(stats, conn, kafka, _kafka_config(pipeline), pipeline, batch_id, extra)


def _bound(function, pipeline: Pipeline):
    """A task's callable: `function` with its pipeline bound. Errors that retrying cannot mend fail the
    task without Airflow retries."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            return function(pipeline, *args, **kwargs)
        except KafkaBatchError as exc:
            if exc.retryable:
                raise
            raise AirflowFailException(str(exc)) from None

    run.__wrapped__ = functools.partial(function, pipeline)  # the signature Airflow passes the context by
    return run


def pipeline_dags(directory: Path | None = None) -> dict[str, DAG]:
    """The DAGs of the pipelines folder by id, for a DAG file's globals: per pipeline its scheduled DAG and
    its replay DAG; per file with a mistake `kafka_batch__invalid__<file>`, which says what is wrong, while
    the other pipelines' DAGs stay. Reads only the YAML files (each once): no database, Kafka or Variable."""
    invalid: dict[str, str] = {}
    dags: dict[str, DAG] = {}
    for pipeline in load_pipelines(directory, invalid=invalid).values():
        dags[pipeline.dag_id] = build_dag(pipeline)
        dags[pipeline.replay_dag_id] = build_replay_dag(pipeline)
    for path, error in invalid.items():
        dag = build_invalid_dag(path, error)
        dags[dag.dag_id] = dag
    return dags


def build_dag(pipeline: Pipeline) -> DAG:
    dag = DAG(
        dag_id=pipeline.dag_id,
        description=f"Exactly-once batches of {pipeline.topics_label} into {', '.join(pipeline.tables)}",
        doc_md=(
            f"Pipeline `{pipeline.name}` (defined in `{pipeline.source}`): reads the next offset ranges of "
            f"{pipeline.topics_label} and commits its sinks' results into {', '.join(f'`{t}`' for t in pipeline.tables)} together "
            "with the new positions, in one Postgres transaction.\n\n" + PLAN_BY_DOCS[pipeline.plan_by].format(
                replay=pipeline.replay_dag_id)
        ),
        schedule=_schedule(pipeline),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        params=batch_params(),
        tags=["kafka_batch", pipeline.name],
    )
    _add_tasks(dag, pipeline, _plan_next)
    return dag


def _plan_next(pipeline: Pipeline, params: dict, run_id: str, dag_run=None, data_interval_start=None,
               data_interval_end=None) -> dict:
    """Persist this run's ranges; a retry or clear of the run gets the same batch back."""
    from kafka_batch.core import planning

    backfill = _is_backfill(dag_run)
    _refuse_offsets_backfill(pipeline, backfill)
    limited = pipeline.with_limits(
        max_records_per_partition=params["max_records_per_partition"],
        max_records_per_batch=params["max_records_per_batch"],
    )
    conn, kafka = _services(pipeline)
    try:
        _analyze(conn, pipeline)
        if params["dry_run"]:
            summary = planning.dry_run(conn, kafka, limited)
            _log_plan("dry run (nothing persisted)", summary)
            return summary
        started = time.monotonic()
        if pipeline.plan_by == "time":
            batch = planning.plan_for_interval(
                conn, kafka, limited, run_id=run_id, dag_id=pipeline.dag_id, publish_config=_publish_config(pipeline),
                start_ms=int(data_interval_start.timestamp() * 1000), end_ms=int(data_interval_end.timestamp() * 1000),
            )
        else:
            batch = planning.plan_batch(conn, kafka, limited, run_id=run_id, dag_id=pipeline.dag_id,
                                        publish_config=_publish_config(pipeline))
        # A backfill asks for its intervals again: a run of it whose batch committed before recomputes it.
        if batch.status == "committed" and (params["recompute"] or backfill):
            log.info("%s: recomputing its committed batch %s", "backfill" if backfill else "recompute", batch.id)
            batch = planning.recompute_batch(conn, pipeline, batch, requested_by=f"airflow:{run_id}",
                                               dag_id=pipeline.dag_id)
        # Every run reports the lag, with or without work: a lag that grows between runs is seen.
        planned = metrics.plan_points(pipeline.name, batch.kind, time.monotonic() - started) if batch.runnable else []
        _observe(pipeline, conn, kafka, None, planned)
    finally:
        conn.close()
    summary = batch.summary()
    _log_plan(f"{batch.kind} {batch.id} ({batch.status})", summary)
    return summary


def _plan_replay(pipeline: Pipeline, params: dict, run_id: str) -> dict:
    """Widen and validate the request, then persist the replay (unless dry run)."""
    from kafka_batch.config import optional_time_ms
    from kafka_batch.core import planning

    request = planning.OffsetRequest(
        params["topic"], tuple(int(p) for p in params["partitions"] or ()), params["from_offset"], params["until_offset"],
        optional_time_ms(params["from_time"], "from_time"), optional_time_ms(params["until_time"], "until_time"),
    )
    conn, kafka = _services(pipeline)
    try:
        batch = planning.plan_replay(
            conn, kafka, pipeline, request, run_id=run_id, requested_by=f"airflow:{run_id}",
            reason=params["reason"], dag_id=pipeline.replay_dag_id,
        )
    finally:
        conn.close()
    summary = batch.summary()
    _log_plan(f"replay {batch.id} ({batch.status}), widened to whole committed ranges", summary)
    return summary


def build_invalid_dag(path: str, error: str) -> DAG:
    """Stands in for a pipeline whose file is invalid: visible, never scheduled, and it says why."""
    with DAG(
        dag_id=invalid_dag_id(path),
        description=f"INVALID pipeline file {Path(path).name}: {error}"[:500],
        doc_md=f"The pipeline file `{path}` could not be loaded; fix it and this DAG becomes the pipeline's:\n\n"
               f"```\n{error}\n```",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        default_args={"retries": 0},
        tags=["kafka_batch", "invalid"],
    ) as dag:

        @task
        def explain() -> None:
            """Fails with the file's error (a trigger of this DAG cannot run the pipeline)."""
            raise AirflowFailException(f"pipeline file {path} is invalid: {error}")

        explain()
    return dag


def _schedule(pipeline: Pipeline):
    """Pipelines planned by time need real data intervals: [previous tick, this tick)."""
    if pipeline.plan_by != "time":
        return pipeline.schedule
    from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

    return CronDataIntervalTimetable(pipeline.schedule, timezone="UTC")


# A partition as the trigger form's list gives it (one per line: text) or as the API may (a number).
_PARTITION = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": r"^\s*[0-9]+\s*$"}]}


def replay_params(pipeline: Pipeline) -> dict[str, Param]:
    """The replay DAG's form: each field described, with an example, in the widget its type calls for (a
    list for partitions, numbers for offsets, a date-time picker for times)."""
    topic = {"type": "string", "enum": list(pipeline.topics)} if pipeline.topics else {"type": "string"}
    return {
        "topic": Param(pipeline.topics[0] if pipeline.topics else "", **topic,
                       description="The topic whose committed ranges are recomputed."),
        "partitions": Param([], type="array", items=_PARTITION,
                            description="Partition numbers, one per line (e.g. 0 and 3); empty: every partition"
                                        " the pipeline has read."),
        "from_offset": Param(None, type=["null", "integer"], minimum=0,
                             description="First offset to recompute (e.g. 1000); give offsets *or* times."),
        "until_offset": Param(None, type=["null", "integer"], minimum=1,
                              description="Offset after the last one to recompute (e.g. 2000: 1000..1999)."),
        "from_time": Param(None, type=["null", "string"], format="date-time",
                           description="Recompute records from this time on (e.g. 2026-11-22T21:00:00Z); with"
                                       " until_time, instead of offsets."),
        "until_time": Param(None, type=["null", "string"], format="date-time",
                            description="Up to this time, excluded (e.g. 2026-11-22T22:00:00Z)."),
        "reason": Param("replay", type="string", minLength=1,
                        description="Why, for the ledger (e.g. 'bug 12: durations counted twice')."),
        "dry_run": Param(True, type="boolean",
                         description="Recompute and show, per group key, the change it would make; commit"
                                     " nothing. Clear it to commit the replay."),
    }


def build_replay_dag(pipeline: Pipeline) -> DAG:
    """A manual DAG to recompute committed ranges of one topic; dry run by default."""
    dag = DAG(
        dag_id=pipeline.replay_dag_id,
        description=f"Recompute committed ranges of {pipeline.name} and swap their contributions",
        doc_md=(
            "Give a topic, partitions (empty: all) and offsets *or* times. The request is widened to the "
            "committed ranges it overlaps; a dry run (the default) recomputes them and reports, per group "
            "key, the totals' change it would make, committing nothing. Positions never move; scheduled "
            "runs go on and serialize with the replay."
        ),
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        params=replay_params(pipeline),
        tags=["kafka_batch", pipeline.name, "replay"],
    )
    _add_tasks(dag, pipeline, _plan_replay, mode="{{ 'preview' if params.dry_run else 'commit' }}")
    return dag


def _log_plan(what: str, summary: dict) -> None:
    log.info("%s: %d ranges, %s offsets", what, len(summary["ranges"]), summary["offsets_planned"])
    for r in summary["ranges"]:
        log.info("  %s[%s] %s..%s", r["topic"], r["partition"], r["from_offset"], r["until_offset"])


def _add_tasks(dag: DAG, pipeline: Pipeline, plan_next, mode: str = "commit") -> None:
    """plan -> execute (spark-submit; skipped when the plan has nothing to run) -> report.

    The tasks are made outside the DAG and then added: a task made inside it gets a deep copy of the
    DAG's params at each constructor level (six per DAG), a third of a 200-pipeline folder's parse; a
    run's tasks read the DAG's params all the same (Airflow merges them into the run's context).
    Each task has its `execution_timeout` from the pipeline (`timeouts`): nothing of a run waits forever."""
    bounds = {task: timedelta(seconds=seconds) for task, seconds in pipeline.task_timeouts().items()}
    plan = PythonOperator(task_id="plan", python_callable=_bound(plan_next, pipeline), doc_md=plan_next.__doc__,
                          execution_timeout=bounds["plan"], **DEFAULT_ARGS)
    execute = BatchSparkSubmitOperator(
        task_id="execute",
        pipeline=pipeline,
        batch_id="{{ ti.xcom_pull(task_ids='plan').get('batch_id') }}",  # none for a dry run
        plan_status="{{ ti.xcom_pull(task_ids='plan')['status'] }}",
        mode=mode,
        **({"pool": pipeline.pool} if pipeline.pool else {}),
        execution_timeout=bounds["execute"],
        **DEFAULT_ARGS,
    )
    dag.add_tasks([plan, execute])
    # Its argument, plan's XCom, makes plan its upstream, and that adds it to plan's DAG.
    report = PythonOperator(task_id="report", python_callable=_bound(_report, pipeline), op_args=[plan.output],
                            trigger_rule=TriggerRule.NONE_FAILED, doc_md=_report.__doc__,
                            execution_timeout=bounds["report"], **DEFAULT_ARGS)
    plan >> execute >> report


def _report(pipeline: Pipeline, summary: dict) -> dict:
    """Counts of the batch and lag per partition, for the log and XCom."""
    from kafka_batch.core.report import report as batch_report
    from kafka_batch.core.report import sentence
    from kafka_batch.core.state import RUNNABLE

    if summary["status"] == "dry_run":
        log.info("dry run: nothing was executed; the plan is in the plan task's log and XCom")
        return summary
    conn, kafka = _services(pipeline)
    try:
        result = batch_report(conn, kafka, pipeline, summary["batch_id"])
        # Counted only where this run executed the batch: planned runnable, now committed.
        _observe(pipeline, conn, kafka, summary["batch_id"] if summary["status"] in RUNNABLE else None)
    finally:
        conn.close()
    log.info("%s", sentence(result))
    for p in result["partitions"]:
        log.info("  %s[%s] position=%s last_stable=%s lag=%s", p["topic"], p["partition"], p["position"],
                 p["last_stable"], p["lag"])
    if "preview" in result:
        log.info("dry run: %d group keys would change (nothing committed):", len(result["preview"]))
        for row in result["preview"]:
            log.info("  %s %s: %s -> %s", row["table"], row["group_key"], row["before"], row["after"])
        result["preview"] = result["preview"][:100]  # XCom stays small; the table keeps them all
    return result
