"""How a batch reaches Spark, for the DAG's operator and the CLI alike: the execution mode is chosen
by the type of the pipeline's Spark connection: a Spark Connect server (`spark.connect`) when it is
one, else one spark-submit call (`spark.submit`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kafka_batch.config import Pipeline
from kafka_batch.connections import ConnectionFields, postgres_params
from kafka_batch.spark import connect, submit


@contextmanager
def batch_execution(
    pipeline: Pipeline, batch_id: int, postgres: ConnectionFields, kafka: ConnectionFields,
    spark: ConnectionFields | None, *, registry: ConnectionFields | None = None,
    output: ConnectionFields | None = None, mode: str = "commit", try_number: int | None = None, log=None,
) -> Iterator:
    """The execution of one batch, by the type of the pipeline's Spark connection (None: undefined,
    spark-submit's defaults); `registry`: the Schema Registry's, for a pipeline that uses one; `output`:
    the Kafka connection its Kafka sink publishes on, when not `kafka`; `log` takes spark-submit's output
    lines."""
    if connect.uses_connect(spark):
        yield connect.ConnectExecution(pipeline, batch_id, spark, postgres, kafka, registry=registry, output=output,
                                       mode=mode, try_number=try_number)
        return
    params = postgres_params(postgres)
    driver_is_local = spark is None or spark.extra.get("deploy-mode") != "cluster"
    span = submit.batch_span(params, batch_id) if driver_is_local else None
    # YARN (also the provider's master when the connection is missing) uploads pyspark's zips to its containers.
    yarn = spark is None or "yarn" in f"{spark.conn_type or ''}://{spark.host or ''}"
    endpoints = tuple(c for c in (postgres, kafka, registry, output) if c is not None)
    with submit.spark_submit_hook(pipeline, batch_id, spark, endpoints, mode=mode, try_number=try_number,
                                  driver_is_local=driver_is_local, span=span, yarn=yarn) as hook:
        if log is not None:
            hook._log = log  # LoggingMixin's logger: the hook logs every spark-submit line through it
        yield submit.SubmitExecution(hook, batch_id, params)
