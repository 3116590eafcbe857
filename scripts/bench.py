"""`make bench`: records/s of the Spark job and of a plain read of the same ranges.

Produces N page views to a fresh topic, plans one batch over all of it, then measures
(1) a plain sequential read of the planned ranges with the project's range reader, no Spark, and
(2) the whole Spark job through spark-submit (JVM start, read, aggregate, commit), wall clock.
Figures are printed, not asserted: targets live here, not in tests.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from kafka_batch import connections
from kafka_batch.cli import submit_batch
from kafka_batch.config import PROJECT_ROOT, load_pipeline
from kafka_batch.core import planning, store
from kafka_batch.kafka_source import KafkaOffsets, read_range
from kafka_batch_dev import sample_data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=int(os.environ.get("BENCH_RECORDS", 500_000)))
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    name = f"bench_{uuid.uuid4().hex[:8]}"
    definition = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    definition.update(name=name, topics=[f"{name}_topic"], schedule=None)
    definition["sinks"]["aggregate"]["table"] = f"{name}_minutes"
    pipelines = Path(tempfile.mkdtemp(prefix="kafka_batch_bench_"))
    (pipelines / f"{name}.yaml").write_text(yaml.safe_dump(definition))
    os.environ["KAFKA_BATCH_PIPELINES_DIR"] = str(pipelines)
    pipeline = load_pipeline(name)

    kafka = connections.kafka_config(connections.from_environment(pipeline.connections.kafka))
    postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
    topic = pipeline.topics[0]
    sample_data.ensure_topic(kafka, topic, args.partitions)
    started = time.monotonic()
    sample_data.produce_page_views(kafka, topic, args.records, seed=1)
    produce_s = time.monotonic() - started
    print(f"produced {args.records} records to {topic} ({args.partitions} partitions) in {produce_s:.1f}s "
          f"= {args.records / produce_s:,.0f} records/s")

    conn = store.connect(postgres)
    batch = planning.plan_batch(conn, KafkaOffsets(kafka), pipeline, run_id="bench")
    print(f"planned batch {batch.id}: {len(batch.ranges)} ranges, {batch.span} offsets")

    started = time.monotonic()
    read = 0
    for r in batch.ranges:
        for messages in read_range(kafka, r, pipeline.read.consume_batch_size):
            read += len(messages)
    plain_s = time.monotonic() - started
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"plain read (range reader, one process, sequential): {read} records in {plain_s:.1f}s "
          f"= {read / plain_s:,.0f} records/s (peak RSS of this process {rss_mb:.0f} MB)")

    started = time.monotonic()
    submit_batch(pipeline, batch.id)
    spark_s = time.monotonic() - started
    committed = store.load_batch(conn, batch.id)
    print(f"spark job (spark-submit local[*], read + aggregate + commit, wall clock incl. JVM start): "
          f"{committed.records_read} records in {spark_s:.1f}s = {committed.records_read / spark_s:,.0f} records/s")
    with conn, conn.cursor() as cur:
        [aggregate] = pipeline.sinks
        cur.execute(f"DROP TABLE IF EXISTS public.{aggregate.table}, kafka_batch.{aggregate.contributions_name}")
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
