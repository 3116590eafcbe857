"""DAG wiring, and nothing else: plan -> has_work -> execute (spark-submit) -> report.

Each task calls the same functions as the CLI; the DAG adds only scheduling, retries and XCom.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, TriggerRule, task

from kafka_batch.config import Pipeline
from kafka_batch.operators import BatchSparkSubmitOperator

log = logging.getLogger(__name__)

DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(minutes=1)}


def _services(pipeline: Pipeline):
    from kafka_batch import connections, offset_store
    from kafka_batch.kafka_source import KafkaOffsets

    postgres = connections.postgres_params(connections.from_airflow(pipeline.connections.postgres))
    kafka = KafkaOffsets(connections.kafka_config(connections.from_airflow(pipeline.connections.kafka)))
    return offset_store.connect(postgres), kafka


def build_dag(pipeline: Pipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id,
        description=f"Exactly-once batches of {', '.join(pipeline.topics)} into {pipeline.table}",
        doc_md=(
            f"Pipeline `{pipeline.name}` (defined in `{pipeline.source}`): reads the next offset ranges of "
            f"{', '.join(pipeline.topics)} and commits the aggregates into `{pipeline.table}` together "
            "with the new positions, in one Postgres transaction."
        ),
        schedule=pipeline.schedule,
        start_date=datetime(2024, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["kafka_batch", pipeline.name],
    ) as dag:

        @task
        def plan(**context) -> dict:
            """Persist this run's ranges; a retry of the run gets the same batch back."""
            from kafka_batch.batches import plan_batch

            conn, kafka = _services(pipeline)
            try:
                batch = plan_batch(conn, kafka, pipeline, run_id=context["run_id"], dag_id=pipeline.dag_id)
            finally:
                conn.close()
            log.info("batch %s (%s): %d ranges, %d offsets", batch.id, batch.status, len(batch.ranges), batch.span)
            for r in batch.ranges:
                log.info("  range %s", r)
            return batch.summary()

        @task.short_circuit(ignore_downstream_trigger_rules=False)
        def has_work(summary: dict) -> bool:
            """An empty plan succeeds without starting Spark."""
            return summary["status"] != "empty"

        execute = BatchSparkSubmitOperator(
            task_id="execute",
            pipeline_name=pipeline.name,
            batch_id="{{ ti.xcom_pull(task_ids='plan')['batch_id'] }}",
        )

        @task(trigger_rule=TriggerRule.NONE_FAILED)
        def report(summary: dict) -> dict:
            """Counts of the batch and lag per partition, for the log and XCom."""
            from kafka_batch.batches import report as batch_report

            conn, kafka = _services(pipeline)
            try:
                result = batch_report(conn, kafka, pipeline, summary["batch_id"])
            finally:
                conn.close()
            log.info("batch %s %s: %s records, lag now %s", result["batch_id"], result["status"],
                     result["records_read"], result["lag"])
            for p in result["partitions"]:
                log.info("  %s[%s] position=%s last_stable=%s lag=%s", p["topic"], p["partition"], p["position"],
                         p["last_stable"], p["lag"])
            return result

        summary = plan()
        has_work(summary) >> execute >> report(summary)
    return dag
