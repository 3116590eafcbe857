"""What a catalog learns of the pipelines through OpenLineage: inputs are the Kafka topics a batch read,
with a run facet of the exact offset ranges (`kafkaBatch`: pipeline, batch id, attempt, kind); outputs
are the sink tables with their columns and the rows changed in each, and the topics a batch published
to (the Kafka sink). Names follow OpenLineage's naming: `kafka://host:port` and the topic;
`postgres://host:port` and `database.schema.table`.

Airflow tasks hand these to Airflow's OpenLineage provider (kafka_batch.airflow.lineage); a rewind, which
only the CLI does, sends its own event through the same transport settings (`client_from_environment`,
`emit_rewind`). Both come from the ledger after the commit, so the catalog is told what was committed.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

import attr
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import RunFacet, output_statistics_output_dataset, schema_dataset

from kafka_batch.config import Pipeline

log = logging.getLogger("kafka_batch.observability.lineage")

KINDS = ("scheduled", "backfill", "manual", "asset_triggered", "replay", "rewind")


@attr.define
class KafkaBatchRunFacet(RunFacet):
    """What a run did to the pipeline's outputs: the exact offset ranges (from_offset inclusive,
    until_offset exclusive) it read, or for a rewind the ranges whose effect it removed; `kind` is one
    of KINDS (a batch's Airflow run type, a replay, or a rewind, which has no batch id nor attempt)."""

    pipeline: str
    batchId: int | None  # noqa: N815 - OpenLineage's facets are camelCase
    attempt: int | None
    kind: str
    ranges: list[dict[str, Any]]


def kafka_namespace(kafka_config: dict) -> str:
    """OpenLineage's namespace of a Kafka cluster: its first bootstrap server."""
    return f"kafka://{kafka_config['bootstrap.servers'].split(',')[0].strip()}"


def run_facet(pipeline: Pipeline, kind: str, ranges, batch_id: int | None = None,
              attempt: int | None = None) -> KafkaBatchRunFacet:
    assert kind in KINDS, kind
    return KafkaBatchRunFacet(
        pipeline=pipeline.name, batchId=batch_id, attempt=attempt, kind=kind,
        ranges=[{"topic": r.topic, "partition": r.partition, "fromOffset": r.from_offset, "untilOffset": r.until_offset}
                for r in ranges])


def datasets(pipeline: Pipeline, kafka_config: dict, postgres: dict, ranges, rows_changed: dict[str, int],
             columns: dict[str, list[tuple[str, str]]]) -> tuple[list[InputDataset], list[OutputDataset]]:
    """The topics of `ranges`, and every output table with its columns and the rows changed in it."""
    namespace = kafka_namespace(kafka_config)
    tables = f"postgres://{postgres['host']}:{postgres.get('port', 5432)}"
    inputs = [InputDataset(namespace=namespace, name=topic) for topic in sorted({r.topic for r in ranges})]
    outputs = [
        OutputDataset(
            namespace=tables, name=f"{postgres['dbname']}.public.{table}",
            facets={"schema": schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in columns.get(table, [])])},
            outputFacets={"outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=rows_changed.get(table, 0))},
        )
        for table in pipeline.tables
    ]
    return inputs, outputs


def topic_outputs(pipeline: Pipeline, publish_config: dict) -> list[OutputDataset]:
    """The topics the pipeline's Kafka sinks publish to, on the cluster they publish on."""
    return [OutputDataset(namespace=kafka_namespace(publish_config), name=sink.topic) for sink in pipeline.publishing_sinks]


def client_from_environment():
    """An OpenLineage client from the settings Airflow's provider reads (`AIRFLOW__OPENLINEAGE__TRANSPORT`
    or `..._CONFIG_PATH`, else OpenLineage's own variables); None when none is set or it is disabled."""
    env = os.environ.get
    if any(env(name, "").strip().lower() in ("true", "1", "t") for name in
           ("AIRFLOW__OPENLINEAGE__DISABLED", "OPENLINEAGE_DISABLED")):
        return None
    from openlineage.client import OpenLineageClient

    if env("AIRFLOW__OPENLINEAGE__TRANSPORT"):
        return OpenLineageClient(config={"transport": json.loads(env("AIRFLOW__OPENLINEAGE__TRANSPORT"))})
    if env("AIRFLOW__OPENLINEAGE__CONFIG_PATH"):
        import yaml

        with open(env("AIRFLOW__OPENLINEAGE__CONFIG_PATH")) as config:
            return OpenLineageClient(config=yaml.safe_load(config))
    if env("OPENLINEAGE_URL") or env("OPENLINEAGE_CONFIG") or any(
            k.startswith("OPENLINEAGE__TRANSPORT") and v for k, v in os.environ.items()):
        return OpenLineageClient()
    return None


def emit_rewind(client, pipeline: Pipeline, kafka_config: dict, postgres: dict, resets, columns: dict) -> None:
    """A COMPLETE event for an applied rewind (core.resets.Reset): the ranges it took out of the outputs
    and the rows it changed, as job `<dag id>.rewind` in Airflow's OpenLineage namespace. Best effort:
    the rewind is committed already, so a transport that fails is one line in the log."""
    rewinds = [r for r in resets if r.direction == "rewind"]
    if not rewinds:
        return
    try:
        from importlib.metadata import version

        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
        from openlineage.client.uuid import generate_new_uuid

        ranges = [r for reset in rewinds for r in reset.retired]
        changed: dict[str, int] = {}
        for reset in rewinds:
            for table, rows in reset.rows_changed.items():
                changed[table] = changed.get(table, 0) + rows
        inputs, outputs = datasets(pipeline, kafka_config, postgres, ranges, changed, columns)
        client.emit(RunEvent(
            eventType=RunState.COMPLETE, eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=str(generate_new_uuid()), facets={"kafkaBatch": run_facet(pipeline, "rewind", ranges)}),
            job=Job(namespace=os.environ.get("AIRFLOW__OPENLINEAGE__NAMESPACE", "default"),
                    name=f"{pipeline.dag_id}.rewind"),
            inputs=inputs, outputs=outputs, producer=f"urn:kafka-batch:{version('kafka-batch')}",
        ))
    except Exception as exc:  # noqa: BLE001 - lineage must never undo nor fail a committed rewind
        log.warning("lineage: the rewind of %s was not sent (%s: %s)", pipeline.name, type(exc).__name__, exc)
