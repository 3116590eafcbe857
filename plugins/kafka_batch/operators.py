"""Airflow operator: SparkSubmitOperator that passes the pipeline's connections to the job safely."""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from kafka_batch import connections, submit
from kafka_batch.config import load_pipeline


class BatchSparkSubmitOperator(SparkSubmitOperator):
    """Submit `spark_jobs/run_batch.py` for one batch.

    The Postgres and Kafka connections are resolved through Airflow at execution time and given to
    spark-submit as environment variables of the child process: they never appear in the rendered
    template fields, the command line, the logs or XCom.
    """

    def __init__(self, *, pipeline_name: str, batch_id: str, mode: str = "commit", **kwargs) -> None:
        self.pipeline_name = pipeline_name
        pipeline = load_pipeline(pipeline_name)
        super().__init__(
            application=str(submit.APPLICATION),
            application_args=submit.application_args(pipeline, batch_id, "{{ ti.try_number }}", mode),
            conn_id=pipeline.connections.spark,
            conf=dict(submit.SPARK_CONF),
            name=f"kafka_batch_{pipeline.name}",
            **kwargs,
        )

    def execute(self, context) -> None:
        self.py_files = str(submit.package_zip())
        super().execute(context)

    def _get_hook(self):
        # The connections go to the hook, not to the templated `env_vars`, so they are never rendered.
        hook = super()._get_hook()
        pipeline = load_pipeline(self.pipeline_name)
        secret_env = submit.connection_environment(
            connections.from_airflow(pipeline.connections.postgres),
            connections.from_airflow(pipeline.connections.kafka),
        )
        hook._env_vars = {**submit.spark_environment(), **(self.env_vars or {}), **secret_env}
        return hook
