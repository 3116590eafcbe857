"""What a catalog learns of a batch through Airflow's OpenLineage provider: the execute task's inputs are
the Kafka topics it read, with a run facet of the exact offset ranges (`kafkaBatch`: pipeline, batch id,
attempt, kind `batch` or `replay`); its outputs are the sink tables with their columns and the rows the
batch changed in each. Names follow OpenLineage's naming: `kafka://host:port` and the topic;
`postgres://host:port` and `database.schema.table`.

Built from the ledger after the commit (core.report.batch_lineage), so what the catalog is told is what
was committed, whichever way Spark ran the batch.
"""

from __future__ import annotations

from typing import Any

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import RunFacet, output_statistics_output_dataset, schema_dataset

from kafka_batch.config import Pipeline


@attr.define
class KafkaBatchRunFacet(RunFacet):
    """The batch a run executed: the exact offset ranges it read (from_offset inclusive, until_offset
    exclusive), and whether it was a scheduled or triggered batch or a replay of committed ranges."""

    pipeline: str
    batchId: int  # noqa: N815 - OpenLineage's facets are camelCase
    attempt: int
    kind: str
    ranges: list[dict[str, Any]]


def kafka_namespace(kafka_config: dict) -> str:
    """OpenLineage's namespace of a Kafka cluster: its first bootstrap server."""
    return f"kafka://{kafka_config['bootstrap.servers'].split(',')[0].strip()}"


def batch_lineage(pipeline: Pipeline, kafka_config: dict, postgres: dict, batch, rows_written: dict[str, int],
                  columns: dict[str, list[tuple[str, str]]]) -> OperatorLineage:
    """The execute task's lineage for a committed batch (`core.report.batch_lineage` gives the rest)."""
    namespace = kafka_namespace(kafka_config)
    topics = sorted({r.topic for r in batch.ranges})
    ranges = [{"topic": r.topic, "partition": r.partition, "fromOffset": r.from_offset, "untilOffset": r.until_offset}
              for r in batch.ranges]
    tables = f"postgres://{postgres['host']}:{postgres.get('port', 5432)}"
    outputs = [
        OutputDataset(
            namespace=tables, name=f"{postgres['dbname']}.public.{table}",
            facets={"schema": schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in columns.get(table, [])])},
            outputFacets={"outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=rows_written.get(table, 0))},
        )
        for table in pipeline.tables
    ]
    return OperatorLineage(
        inputs=[InputDataset(namespace=namespace, name=topic) for topic in topics],
        outputs=outputs,
        run_facets={"kafkaBatch": KafkaBatchRunFacet(pipeline=pipeline.name, batchId=batch.id, attempt=batch.attempt,
                                                     kind=batch.kind, ranges=ranges)},
    )
