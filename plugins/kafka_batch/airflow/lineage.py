"""A committed batch's lineage, handed to Airflow's OpenLineage provider by the execute operator
(`get_openlineage_facets_on_complete`): the topics and exact ranges it read, the tables it wrote and the
topics it published to (kafka_batch.observability.lineage builds them). Its kind is the DAG run's type (scheduled, backfill, manual,
asset_triggered), or replay for the replay DAG's batches."""

from __future__ import annotations

from airflow.providers.openlineage.extractors import OperatorLineage

from kafka_batch.config import Pipeline
from kafka_batch.observability import lineage


def batch_lineage(pipeline: Pipeline, kafka_config: dict, postgres: dict, batch, run_type: str,
                  rows_written: dict[str, int], columns: dict[str, list[tuple[str, str]]],
                  publish_config: dict | None = None) -> OperatorLineage:
    """The execute task's lineage for a committed batch (`core.report.batch_lineage` gives the rest);
    `publish_config`: the cluster the Kafka sink publishes on, when not `kafka_config`."""
    inputs, outputs = lineage.datasets(pipeline, kafka_config, postgres, batch.ranges, rows_written, columns)
    outputs += lineage.topic_outputs(pipeline, publish_config or kafka_config)
    kind = "replay" if batch.kind == "replay" else run_type
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={"kafkaBatch": lineage.run_facet(
        pipeline, kind, batch.ranges, batch_id=batch.id, attempt=batch.attempt)})
