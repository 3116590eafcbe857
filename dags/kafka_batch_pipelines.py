"""Airflow DAGs: one per pipeline defined in pipelines/*.yaml (dag_id `kafka_batch__<name>`).

Parsing reads only those YAML files: no database, Kafka or Variable access at import time.
"""

from kafka_batch.config import load_pipelines
from kafka_batch.dag_factory import build_dag

for _pipeline in load_pipelines().values():
    globals()[_pipeline.dag_id] = build_dag(_pipeline)
