"""The execute step: one batch through the same call the CLI makes (kafka_batch.spark.submit):
spark-submit, or a Spark Connect server when the pipeline's Spark connection is one.

Its outlets are one Asset per sink table, named `kafka_batch.<table>`, and per topic a Kafka sink
publishes to, `kafka_batch.topic.<topic>` (`sink_assets`): a DAG scheduled on
`Asset("kafka_batch.page_view_minutes")` runs after each batch that changed that table. Airflow
records an outlet event whenever the task succeeds, so the task succeeds only when the batch really
committed now; a replay's dry run (preview) ends `skipped`, and so does the task, before it starts Spark,
for an empty plan, a dry run or a batch committed before. With OpenLineage on, a commit's lineage (the
topics and exact ranges read, the tables and topics written: kafka_batch.airflow.lineage) goes to the
catalog.
"""

from __future__ import annotations

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSkipException

from kafka_batch import connections
from kafka_batch.config import Pipeline
from kafka_batch.core.state import RUNNABLE
from kafka_batch.errors import KafkaBatchError
from kafka_batch.observability import metrics
from kafka_batch.spark.execution import batch_execution

# What each outlet event's extra holds: the batch, its exact ranges and its counts.
ASSET_EVENT_KEYS = ("pipeline", "batch_id", "kind", "ranges", "records_read", "records_invalid")


class BatchSparkSubmitOperator(BaseOperator):
    """Submit `spark_jobs/run_batch.py` for one batch.

    The Postgres and Kafka connections are resolved through Airflow at execution time and given to
    spark-submit as environment variables of the child process: they never appear in rendered
    template fields, the command line, the logs or XCom. Errors the job reports as not retryable
    (bad data, a lost race, data loss) fail the task without Airflow retries.
    """

    template_fields = ("batch_id", "plan_status", "mode")
    ui_color = "#e8f4fe"

    def __init__(self, *, pipeline: Pipeline, batch_id: str, plan_status: str, mode: str = "commit",
                 **kwargs) -> None:
        kwargs.setdefault("outlets", sink_assets(pipeline))
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.batch_id = batch_id
        self.plan_status = plan_status
        self.mode = mode
        self._execution = None
        self._lineage = None  # a commit's, when OpenLineage is on (kafka_batch.airflow.lineage): no secret in it

    def execute(self, context) -> None:
        if self.plan_status not in RUNNABLE:  # an empty plan, a dry run, a batch committed before
            raise AirflowSkipException(f"nothing to execute: the plan is {self.plan_status}")
        postgres = connections.from_airflow(self.pipeline.connections.postgres)
        kafka = connections.from_airflow(self.pipeline.connections.kafka)
        try:
            spark = connections.from_airflow(self.pipeline.connections.spark)
        except AirflowNotFoundException:  # spark-submit with its defaults, as the provider's hook does
            spark = None
        registry = None
        if self.pipeline.uses_registry:
            registry = connections.from_airflow(self.pipeline.connections.schema_registry)
        output = None
        if self.pipeline.publishing_sinks and self.pipeline.connections.kafka_output:
            output = connections.from_airflow(self.pipeline.connections.kafka_output)
        batch_id = int(self.batch_id)
        with batch_execution(self.pipeline, batch_id, postgres, kafka, spark, registry=registry, output=output,
                             mode=self.mode, try_number=context["ti"].try_number) as execution:
            self._execution = execution
            try:
                execution.run()
            except KafkaBatchError as exc:
                metrics.send(airflow_stats(), metrics.failure_points(self.pipeline.name, self._kind, exc))
                if not exc.retryable:
                    raise AirflowFailException(str(exc)) from None
                raise
        self._announce(context, connections.postgres_params(postgres), connections.kafka_config(kafka), batch_id,
                       None if output is None else connections.kafka_config(output))

    def _announce(self, context, postgres: dict, kafka: dict, batch_id: int, publish: dict | None) -> None:
        """Attach the batch to each outlet's event and, when OpenLineage is on, keep its lineage from the
        ledger; anything but a commit skips the task (no event, no lineage)."""
        from airflow.providers.openlineage.conf import is_disabled

        from kafka_batch.core import batches, database, report

        lineage = not is_disabled()
        conn = database.connect(postgres)
        try:
            if lineage:
                batch, rows_written, columns = report.batch_lineage(conn, batch_id, self.pipeline.tables)
            else:
                batch = batches.load_batch(conn, batch_id)
        finally:
            conn.close()
        if batch.status != "committed":
            raise AirflowSkipException(f"batch {batch_id} is {batch.status}: nothing committed, no asset event")
        summary = batch.summary()  # for the DAGs downstream: which batch, what it read, exactly
        for asset in self.outlets:
            context["outlet_events"][asset].extra.update({key: summary[key] for key in ASSET_EVENT_KEYS})
        if lineage:  # its classes cost a task half a second to import: only when someone receives it
            from kafka_batch.airflow.lineage import batch_lineage

            run_type = str(getattr(context["dag_run"].run_type, "value", context["dag_run"].run_type))
            self._lineage = batch_lineage(self.pipeline, kafka, postgres, batch, run_type, rows_written, columns,
                                          publish)

    def get_openlineage_facets_on_complete(self, task_instance):
        """OpenLineage's provider asks this after a success: the topics and exact ranges a commit read,
        the tables it wrote (kafka_batch.airflow.lineage)."""
        return self._lineage

    @property
    def _kind(self) -> str:
        """The batch's kind, as its DAG says (dag_factory.build_replay_dag), for a failure's metrics."""
        return "replay" if self.dag_id.endswith("__replay") else "batch"

    def on_kill(self) -> None:
        if self._execution is not None:
            self._execution.kill()


def airflow_stats() -> metrics.Stats | None:
    """Airflow's own Stats when its `[metrics]` send anywhere; None otherwise, so that nothing is read
    (the lag, the oldest unread record) for metrics no one receives."""
    from airflow.sdk.configuration import conf

    if not any(conf.getboolean("metrics", key, fallback=False)
               for key in ("statsd_on", "otel_on", "statsd_datadog_enabled")):
        return None
    from airflow.sdk.observability.stats import Stats

    return Stats


def sink_assets(pipeline: Pipeline) -> list[Asset]:
    """One Asset per table the pipeline's sinks write, `kafka_batch.<table>`, and per topic its Kafka sink
    publishes to, `kafka_batch.topic.<topic>`."""
    return ([Asset(name=f"kafka_batch.{table}") for table in pipeline.tables]
            + [Asset(name=f"kafka_batch.topic.{sink.topic}") for sink in pipeline.publishing_sinks])
