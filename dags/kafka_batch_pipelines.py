"""Airflow DAGs: per pipeline in pipelines/*.yaml, the scheduled dag `kafka_batch__<name>` and a manual
replay dag `kafka_batch__<name>__replay`.

Parsing reads only those YAML files (each once): no database, Kafka or Variable access at import time.
A file with a mistake costs only its own pipeline: it becomes `kafka_batch__invalid__<file>`, whose
description and only task say what is wrong, and the other pipelines' DAGs stay.
"""

from kafka_batch.airflow.dag_factory import build_dag, build_invalid_dag, build_replay_dag
from kafka_batch.config import load_pipelines

_invalid: dict[str, str] = {}
for _pipeline in load_pipelines(invalid=_invalid).values():
    globals()[_pipeline.dag_id] = build_dag(_pipeline)
    globals()[f"{_pipeline.dag_id}__replay"] = build_replay_dag(_pipeline)
for _path, _error in _invalid.items():
    _dag = build_invalid_dag(_path, _error)
    globals()[_dag.dag_id] = _dag
