"""The execute step: spark-submit one batch through the same call the CLI makes (kafka_batch.spark.submit)."""

from __future__ import annotations

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from kafka_batch import connections
from kafka_batch.config import Pipeline
from kafka_batch.errors import KafkaBatchError
from kafka_batch.spark import submit


class BatchSparkSubmitOperator(BaseOperator):
    """Submit `spark_jobs/run_batch.py` for one batch.

    The Postgres and Kafka connections are resolved through Airflow at execution time and given to
    spark-submit as environment variables of the child process: they never appear in rendered
    template fields, the command line, the logs or XCom. Errors the job reports as not retryable
    (bad data, a lost race, data loss) fail the task without Airflow retries.
    """

    template_fields = ("batch_id", "mode")
    ui_color = "#e8f4fe"

    def __init__(self, *, pipeline: Pipeline, batch_id: str, mode: str = "commit", **kwargs) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.batch_id = batch_id
        self.mode = mode
        self._hook = None

    def execute(self, context) -> None:
        postgres = connections.from_airflow(self.pipeline.connections.postgres)
        conns = (postgres, connections.from_airflow(self.pipeline.connections.kafka))
        batch_id = int(self.batch_id)
        with submit.spark_submit_hook(self.pipeline, batch_id, conns, mode=self.mode,
                                      try_number=context["ti"].try_number) as hook:
            self._hook = hook
            try:
                submit.run(hook, batch_id, connections.postgres_params(postgres))
            except KafkaBatchError as exc:
                if not exc.retryable:
                    raise AirflowFailException(str(exc)) from None
                raise

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()
