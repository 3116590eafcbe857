"""Airflow DAGs from the pipeline files: per file in the pipelines folder (KAFKA_BATCH_PIPELINES_DIR;
docs/installing.md) the scheduled DAG `kafka_batch__<name>` and the replay DAG `kafka_batch__<name>__replay`.
This is the whole DAG file a user needs beside an installed kafka-batch."""

from kafka_batch.airflow.dag_factory import pipeline_dags

globals().update(pipeline_dags())
