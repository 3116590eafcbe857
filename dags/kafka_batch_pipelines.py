"""Airflow DAGs: per pipeline in pipelines/*.yaml, the scheduled dag `kafka_batch__<name>` and a manual
replay dag `kafka_batch__<name>__replay`.

Parsing reads only those YAML files: no database, Kafka or Variable access at import time.
"""

from kafka_batch.airflow.dag_factory import build_dag, build_replay_dag
from kafka_batch.config import load_pipelines

for _pipeline in load_pipelines().values():
    globals()[_pipeline.dag_id] = build_dag(_pipeline)
    globals()[f"{_pipeline.dag_id}__replay"] = build_replay_dag(_pipeline)
