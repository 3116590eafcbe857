"""The Spark driver of one batch: load the persisted plan, read it, aggregate, commit.

Never plans: the ranges come from Postgres, so every attempt of a batch reads the same records.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

import pyarrow as pa
import pyarrow.compute as pc

from kafka_batch import connections, offset_store
from kafka_batch.committer import CommitResult, FencedAttempt, RangeCounts, commit_batch, preview_replay
from kafka_batch.config import Pipeline, load_pipeline
from kafka_batch.kafka_source import KafkaOffsets
from kafka_batch.planner import OffsetRange, recheck_retention, split_for_tasks
from kafka_batch.spark_source import read_ranges
from kafka_batch.transform import aggregate

log = logging.getLogger("kafka_batch.job")


def split_result(result: pa.Table) -> tuple[pa.Table, dict[int, RangeCounts]]:
    """Per-range counts, and the contribution rows (groups of tombstones only are not contributions)."""
    totals = result.group_by("range_id").aggregate([("records", "sum"), ("tombstones", "sum")])
    counts = {
        row["range_id"]: RangeCounts(row["records_sum"] or 0, row["tombstones_sum"] or 0)
        for row in totals.to_pylist()
    }
    contributions = result.filter(pc.greater(result["records"], 0))
    return contributions, counts


def _recheck_retention(conn, kafka: dict, on_data_loss: str, ranges) -> list[OffsetRange]:
    """Before Spark starts: fail, or under `skip` record, any part of the plan deleted since planning.

    Deletion during the read itself surfaces in the reader as DataLossError and fails the attempt;
    the next attempt lands here and sees it.
    """
    offsets = KafkaOffsets(kafka).offsets([(r.topic, r.partition) for r in ranges])
    checked = []
    for r in ranges:
        now = recheck_retention(r, offsets[(r.topic, r.partition)].log_start, on_data_loss)
        if now.lost_until != r.lost_until:
            log.warning("data loss in %s: offsets %s..%s were deleted before they were read; skipping them",
                        r, r.from_offset, now.lost_until)
            offset_store.record_loss(conn, r.range_id, now.lost_until)
        checked.append(now)
    return checked


class _FenceWatch:
    """Polls the batch's attempt token while Spark works; a newer attempt cancels this one's Spark jobs.

    The commit transaction is what guarantees a zombie cannot commit; this only makes it stop early
    instead of reading and aggregating a whole batch for nothing.
    """

    def __init__(self, spark, postgres: dict, batch_id: int, attempt: int, interval: float):
        self.fenced_by: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, args=(spark, postgres, batch_id, attempt, interval), daemon=True, name="fence-watch"
        )

    def __enter__(self) -> _FenceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _watch(self, spark, postgres: dict, batch_id: int, attempt: int, interval: float) -> None:
        conn = offset_store.connect(postgres)
        try:
            while not self._stop.wait(interval):
                if self.fenced_by is None:
                    current = offset_store.current_attempt(conn, batch_id)
                    if current == attempt:
                        continue
                    self.fenced_by = current
                    log.warning("batch %s: attempt %s started; cancelling attempt %s", batch_id, current, attempt)
                # Again at every tick: cancelling only reaches jobs already submitted, and Spark may
                # still be planning the job when the newer attempt is first seen.
                spark.sparkContext.cancelAllJobs()
        finally:
            conn.close()


def run_batch(
    spark, pipeline: Pipeline, postgres: dict, kafka: dict, batch_id: int, try_number: int | None = None,
    mode: str = "commit",
) -> CommitResult:
    """Execute a batch: commit it, or (mode `preview`, replays only) store how it would change the totals."""
    conn = offset_store.connect(postgres)
    try:
        batch = offset_store.load_batch(conn, batch_id)
        if batch.pipeline != pipeline.name:
            raise offset_store.BatchError(f"batch {batch_id} belongs to pipeline {batch.pipeline!r}, not {pipeline.name!r}")
        if batch.status == "committed":
            log.info("batch %s is already committed; nothing to do", batch_id)
            return CommitResult(batch_id, True, batch.records_read or 0, 0)
        if batch.status not in ("planned", "failed"):
            raise FencedAttempt(f"batch {batch_id} is {batch.status}; it can no longer be executed")
        attempt = offset_store.claim_attempt(conn, batch_id)
        if try_number is not None:
            offset_store.record_try(conn, batch_id, try_number)
        log.info("batch %s attempt %s: %d ranges, %d offsets", batch_id, attempt, len(batch.ranges), batch.span)
        try:
            # A replay recomputes what was read; records deleted since cannot be recomputed.
            policy = pipeline.on_data_loss if batch.kind == "batch" else "fail"
            ranges = _recheck_retention(conn, kafka, policy, batch.ranges)
            limits = pipeline.limits
            tasks = split_for_tasks([r.readable() for r in ranges], limits.max_records_per_task, limits.min_tasks)
            records = read_ranges(spark, kafka, tasks, pipeline.read)
            with _FenceWatch(spark, postgres, batch_id, attempt, pipeline.read.fence_check_seconds) as watch:
                try:
                    result_table = aggregate(records, pipeline).toArrow()
                except Exception:
                    if watch.fenced_by is not None:
                        raise FencedAttempt(
                            f"batch {batch_id}: attempt {attempt} stopped early, attempt {watch.fenced_by} started since"
                        ) from None
                    raise
            contributions, counts = split_result(result_table)
            if mode == "preview":
                changed = preview_replay(conn, pipeline, batch_id, attempt, contributions)
                log.info("replay %s previewed: %d group keys would change; nothing committed", batch_id, changed)
                return CommitResult(batch_id, False, sum(c.records for c in counts.values()), changed)
            result = commit_batch(conn, pipeline, batch_id, attempt, contributions, counts)
        except Exception as exc:
            offset_store.mark_failed(conn, batch_id, attempt, f"{type(exc).__name__}: {exc}")
            raise
        log.info("batch %s committed: %d records, %d contribution rows", batch_id, result.records, result.contribution_rows)
        return result
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute one planned batch (spark-submit entry point).")
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--batch-id", required=True, type=int)
    parser.add_argument("--try-number", type=int, help="the Airflow try executing the batch, for the ledger")
    parser.add_argument("--mode", choices=["commit", "preview"], default="commit",
                        help="preview: a replay's dry run, stores the change it would make and commits nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from pyspark.sql import SparkSession

    pipeline = load_pipeline(args.pipeline)
    postgres = connections.postgres_params(connections.from_environment(pipeline.connections.postgres))
    kafka = connections.kafka_config(connections.from_environment(pipeline.connections.kafka))
    spark = (
        SparkSession.builder.appName(f"kafka_batch:{pipeline.name}:batch-{args.batch_id}")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        result = run_batch(spark, pipeline, postgres, kafka, args.batch_id, args.try_number, args.mode)
    finally:
        spark.stop()
    state = "was already committed" if result.already_committed else "committed" if args.mode == "commit" else "previewed"
    print(f"kafka_batch: batch {result.batch_id} {state}: {result.records} records", file=sys.stderr)
    return 0
