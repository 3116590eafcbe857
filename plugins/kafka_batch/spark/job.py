"""The Spark driver of one batch: load the persisted plan and its definition, read, compute, commit.

Never plans and never reads the pipeline's YAML: the ranges and the definition come from Postgres,
so every attempt of a batch reads the same records and computes the same thing.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable

import pyarrow as pa

from kafka_batch import connections
from kafka_batch.config import Pipeline
from kafka_batch.core import attempts, batches, data_loss, database, kafka_checks
from kafka_batch.core.commit import CommitResult, commit_batch, preview_replay
from kafka_batch.errors import (
    INVALID_RECORD,
    FencedAttempt,
    InputError,
    KafkaBatchError,
    one_line,
    raised_in_task,
    without_sqlstate,
    without_traces,
)
from kafka_batch.formats.columns import Decoded, schema_id_column
from kafka_batch.kafka.ranges import OffsetRange, pack_tasks, recheck_retention, split_for_tasks
from kafka_batch.kafka.source import KafkaOffsets
from kafka_batch.observability import timings
from kafka_batch.sinks.base import StageContext, collect_arrow
from kafka_batch.spark.json_fields import JsonFields, parses_in_reader
from kafka_batch.spark.reader import ALL_COLUMNS, columns_used, expression_words, read_ranges
from kafka_batch.spark.transform import invalid_records, parse_records

log = logging.getLogger("kafka_batch.job")


def _recheck_retention(conn, kafka: KafkaOffsets, on_data_loss: str, ranges) -> list[OffsetRange]:
    """Before Spark starts: fail, or under `skip` record, any part of the plan deleted since planning.

    Deletion during the read itself surfaces in the reader as DataLossError and fails the attempt;
    the next attempt lands here and sees it.
    """
    log_starts = kafka.log_starts([(r.topic, r.partition) for r in ranges])
    checked = []
    for r in ranges:
        now = recheck_retention(r, log_starts[(r.topic, r.partition)], on_data_loss)
        if now.lost_until != r.lost_until:
            log.warning("data loss in %s: offsets %s..%s were deleted before they were read; skipping them",
                        r, r.from_offset, now.lost_until)
            data_loss.record_loss(conn, r.range_id, now.lost_until)
        checked.append(now)
    return checked


class _WhileSparkWorks:
    """A daemon thread running `_watch(*args)` while the `with` block runs, told to stop at its end."""

    def __init__(self, name: str, *args):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=args, daemon=True, name=name)

    def _watch(self, *args) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class _FenceWatch(_WhileSparkWorks):
    """Polls the batch's attempt token while Spark works; a newer attempt (or a status that can no
    longer commit, e.g. superseded) cancels this attempt's Spark jobs.

    The commit transaction is what guarantees a zombie cannot commit; this only makes it stop early
    instead of reading and computing a whole batch for nothing.
    """

    def __init__(self, spark, postgres: dict, batch_id: int, attempt: int, interval: float):
        self.fenced_by: str | None = None
        super().__init__("fence-watch", spark, postgres, batch_id, attempt, interval)

    def _watch(self, spark, postgres: dict, batch_id: int, attempt: int, interval: float) -> None:
        from kafka_batch.core.state import BatchStatus

        conn = None
        try:
            while not self._stop.wait(interval):
                if self.fenced_by is None:
                    try:
                        conn = conn if conn is not None and not conn.closed else database.connect(postgres)
                        current = attempts.current_attempt(conn, batch_id)
                    except Exception as exc:  # noqa: BLE001 - a watch that cannot ask retries at the next tick
                        log.warning("fence watch: could not read batch %s (%s); retrying", batch_id, exc)
                        conn = None
                        continue
                    if current is not None and current[0] == attempt and BatchStatus(current[1]).runnable:
                        continue
                    self.fenced_by = "gone" if current is None else f"attempt {current[0]} ({current[1]})"
                    log.warning("batch %s: now %s; cancelling attempt %s", batch_id, self.fenced_by, attempt)
                # Again at every tick: cancelling only reaches jobs already submitted, and Spark may
                # still be planning the job when the newer attempt is first seen.
                _cancel(spark, batch_id)
        finally:
            if conn is not None:
                conn.close()


class _Progress(_WhileSparkWorks):
    """Logs the read's progress every `interval` seconds while Spark works. The CLI shows these lines;
    Spark's own log goes to a file."""

    def __init__(self, batch_id: int, describe: Callable[[float], str], interval: float = 10.0):
        super().__init__("progress", batch_id, describe, interval)

    def _watch(self, batch_id: int, describe: Callable[[float], str], interval: float) -> None:
        started = time.monotonic()
        while not self._stop.wait(interval):
            log.info("batch %s progress: %s", batch_id, describe(time.monotonic() - started))


class _ReadProgress:
    """(Sub-)ranges and records read by the finished read tasks, from two accumulators they add to."""

    def __init__(self, spark, pieces: int):
        self.accumulators = (spark.sparkContext.accumulator(0), spark.sparkContext.accumulator(0))
        self.pieces = pieces

    def __call__(self, seconds: float) -> str:
        records, done = (a.value for a in self.accumulators)
        return f"{done} of {self.pieces} ranges read, {records} records, {records / seconds:.0f} records/s"

    def close(self) -> None:
        pass


class _ConnectProgress:
    """Spark Connect has no accumulators: the tasks done in the running operation, as the server reports."""

    def __init__(self, spark):
        self.done = self.total = 0
        self.accumulators = None
        self._spark = spark
        spark.registerProgressHandler(self._report)

    def _report(self, stages, inflight_tasks, operation_id, done) -> None:
        stages = list(stages or ())
        self.total, self.done = sum(s.num_tasks for s in stages), sum(s.num_completed_tasks for s in stages)

    def __call__(self, seconds: float) -> str:
        return f"{self.done} of {self.total} Spark tasks done ({seconds:.0f} s)"

    def close(self) -> None:
        self._spark.removeProgressHandler(self._report)


def is_connect(spark) -> bool:
    """A Spark Connect session (no SparkContext on this side: no accumulators, cancel by interrupt)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _parallelism(spark) -> int:
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    return int(spark.conf.get("spark.default.parallelism", "1"))


def batch_tag(batch_id: int) -> str:
    """The tag of a batch's Spark operations on a shared Spark Connect session: cancelling a batch
    interrupts only its own."""
    return f"kafka_batch_batch_{batch_id}"


def _lane(batch: batches.Batch) -> str:
    """The batches of which only one can be running for good: a pipeline's batches (planning supersedes
    every older one not committed), or one replay alone. A batch's attempt may stop the rest of its lane."""
    return f"pipeline_{batch.pipeline}" if batch.kind == "batch" else f"replay_{batch.id}"


def _lane_tag(batch: batches.Batch) -> str:
    return f"kafka_batch_lane_{_lane(batch)}"


def _cached_read_view(batch: batches.Batch) -> str:
    """The temporary view that names a batch's cached read, one per lane: on a shared Spark Connect session
    a later attempt finds by this name what a killed one cached."""
    return f"kafka_batch_read_{_lane(batch)}"


def _release_lane(spark, batch: batches.Batch, shares_read: bool) -> None:
    """What an attempt killed with its process (a lost Airflow worker, a killed CLI) left on the shared
    Spark Connect session, found by its lane: its operations still running on the server (a Connect
    execution outlives its client), interrupted, and its cached read, uncached. Whatever they belong to
    can no longer commit: an earlier attempt of this batch, or a batch this one's plan superseded.

    The uncache is SQL: a Connect server may answer a repeated `spark.catalog` call from its plan cache,
    which the session's clients share, without running it."""
    interrupted = spark.interruptTag(_lane_tag(batch))
    if interrupted:
        log.warning("batch %s: %d Spark operation(s) of an attempt that can no longer commit were still running on"
                    " the shared session; interrupted", batch.id, len(interrupted))
    if shares_read:  # only such a read is cached and named
        spark.sql(f"UNCACHE TABLE IF EXISTS {_cached_read_view(batch)}")


def _cancel(spark, batch_id: int) -> None:
    """Stop the batch's Spark jobs: by its tag on a shared Connect session; all jobs of the
    application under spark-submit, whose application runs this one batch."""
    if is_connect(spark):
        spark.interruptTag(batch_tag(batch_id))
    else:
        spark.sparkContext.cancelAllJobs()


def env_kafka_config(pipeline: Pipeline) -> dict:
    return connections.kafka_config(connections.from_environment(pipeline.connections.kafka))


def env_publish_config(pipeline: Pipeline) -> dict:
    return connections.kafka_config(connections.from_environment(pipeline.connections.publish))


def env_registry_config(pipeline: Pipeline) -> dict:
    return connections.schema_registry_config(connections.from_environment(pipeline.connections.schema_registry))


def run_batch(
    spark, postgres: dict, batch_id: int, try_number: int | None = None, mode: str = "commit",
    kafka_config: Callable[[Pipeline], dict] = env_kafka_config,
    registry_config: Callable[[Pipeline], dict] = env_registry_config,
    publish_config: Callable[[Pipeline], dict] = env_publish_config,
) -> CommitResult:
    """Execute a batch: commit it, or (mode `preview`, replays only) store how it would change the outputs."""
    conn = database.connect(postgres)
    try:
        batch = batches.load_batch(conn, batch_id)
        if batch.status == "committed":
            log.info("batch %s is already committed; nothing to do", batch_id)
            return CommitResult(batch_id, True, batch.records_read or 0, 0)
        pipeline = batches.batch_pipeline(conn, batch)
        kafka = kafka_config(pipeline)
        publish = publish_config(pipeline) if pipeline.publishing_sinks else None  # a missing one fails here
        writes_registry = any(sink.uses_registry for sink in pipeline.publishing_sinks)
        registry = registry_config(pipeline) if writes_registry else None
        attempt = attempts.claim_attempt(conn, batch_id, try_number)
    finally:
        conn.close()
    timings.mark("batch_loaded")
    log.info("batch %s attempt %s: %d ranges, %d offsets (definition %s)", batch_id, attempt, len(batch.ranges),
             batch.span, batch.definition_hash[:12])
    publication = None
    try:
        decoder = value_decoder(pipeline, registry_config)
        if mode == "commit":
            publication = _open_publication(postgres, pipeline, batch, attempt, publish, registry)
        reading = time.monotonic()
        outputs, read_tasks, quarantined, schema_ids = _compute(spark, pipeline, postgres, kafka, decoder, batch,
                                                                attempt, publication)
        read_seconds = time.monotonic() - reading
        # A fresh connection for the commit: one left idle through the Spark run may have been dropped.
        timings.mark("commit_start")
        conn = database.connect(postgres)
        try:
            if mode == "preview":
                result = preview_replay(conn, pipeline, batch_id, attempt, outputs, read_tasks)
                log.info("replay %s previewed: %d keys would change; nothing committed", batch_id, result.rows_written)
                return result
            result = commit_batch(conn, pipeline, batch_id, attempt, outputs, read_tasks, quarantined, schema_ids,
                                  read_seconds=read_seconds, kafka_config=publish, registry_config=registry)
        finally:
            conn.close()
        timings.mark("commit_done")
    except Exception as exc:
        _record_failure(postgres, pipeline, batch_id, attempt, exc)
        raise
    finally:
        if publication is not None:
            publication.close()  # what the commit did not complete is aborted, never visible
    log.info("batch %s committed: %d records, %d rows written, %d quarantined", batch_id, result.records,
             result.rows_written, 0 if quarantined is None else quarantined.num_rows)
    _discard_staging(postgres, pipeline, batch_id, None)  # committed: no attempt of it can commit any more
    return result


def _open_publication(postgres: dict, pipeline: Pipeline, batch: batches.Batch, attempt: int, publish: dict | None,
                      registry: dict | None):
    """The publication of the pipeline's sink that publishes what Spark computes (the Kafka sink's rows
    shape), opened before the read; None if there is none."""
    if not pipeline.publishing_sinks:
        return None
    conn = database.connect(postgres)
    try:
        with database.transaction(conn) as cur:
            pending = batches.may_commit(cur, pipeline.name)
    finally:
        conn.close()
    opened = [p for sink in pipeline.publishing_sinks if (p := sink.open(batch, attempt, publish, pending, registry))]
    return opened[0] if opened else None


def _compute(spark, pipeline: Pipeline, postgres: dict, kafka: dict, decoder, batch: batches.Batch, attempt: int,
             publication=None):
    """Read the batch's ranges once and let every sink compute its result from the parsed records (a
    publishing sink sends its messages to `publication` as they arrive)."""
    conn = database.connect(postgres)
    try:
        cluster = KafkaOffsets(kafka)
        kafka_checks.refuse_unsafe_reads(conn, cluster.cluster_id(), batch.id)
        # A replay recomputes what was read; records deleted since cannot be recomputed.
        policy = pipeline.on_data_loss if batch.kind == "batch" else "fail"
        ranges = _recheck_retention(conn, cluster, policy, batch.ranges)
    finally:
        conn.close()
    shared = sum(sink.reads_records for sink in pipeline.sinks) > 1
    if is_connect(spark):
        _release_lane(spark, batch, shared)
    limits = pipeline.limits
    cores = _parallelism(spark)  # under Spark Connect a round trip: asked once
    pieces = split_for_tasks([r.readable() for r in ranges], limits.max_records_per_task, limits.min_tasks)
    # Small ranges share a task (one consumer for several partitions); at least one task per core.
    tasks = pack_tasks(pieces, limits.max_records_per_task, max(limits.min_tasks, cores))
    read_tasks = len(tasks)  # one Spark partition, so one read task, each
    progress = _ConnectProgress(spark) if is_connect(spark) else _ReadProgress(spark, len(pieces))
    observations = []

    def read_records(some_tasks):
        read, observation = _observe_schema_ids(read_ranges(
            spark, kafka, some_tasks, pipeline.read, _columns(pipeline), progress.accumulators, decoder,
            _values(pipeline, decoder)), pipeline)
        observations.append(observation)
        return parse_records(read, pipeline)

    records = read_records(tasks)
    if shared:
        records = records.persist()  # every sink computes from one read of the topic
        records.createOrReplaceTempView(_cached_read_view(batch))  # a later batch uncaches it if this attempt dies

    def waves():
        """The records again, one read task at a time, for a sink that streams a result as big as the
        batch (when it reads the records alone: a persisted read, beside other sinks, is held by Spark
        whole anyway): Spark keeps a few tasks' results for the driver, whatever the batch's size."""
        if shared or len(tasks) <= cores:
            yield records
            return
        observations.pop(0)  # the whole batch's read, which no action runs then
        for task in tasks:
            yield read_records([task])

    stage = StageContext(batch.id, attempt, postgres, tasks, publication, waves, cores)
    spark.addTag(batch_tag(batch.id))  # on this thread's operations: the fence watch interrupts only them
    spark.addTag(_lane_tag(batch))  # and a later batch of the lane, if this attempt dies with its process
    with (_FenceWatch(spark, postgres, batch.id, attempt, pipeline.read.fence_check_seconds) as watch,
          _Progress(batch.id, progress)):
        try:
            log.info("batch %s: reading %d range(s) (%d after splitting) in %d Spark task(s)", batch.id, len(ranges),
                     len(pieces), read_tasks)
            timings.mark("read_start", tasks=read_tasks, ranges=len(pieces))
            outputs = {sink.kind: sink.compute(records, stage) for sink in pipeline.sinks}
            timings.mark("computed")
            counts = next(o.counts for o in outputs.values() if o.counts is not None)
            quarantined = _quarantine(spark, kafka, decoder, tasks, pipeline, batch, counts)
            schema_ids = _schema_ids(observations, counts, lambda: read_ranges(spark, kafka, tasks, pipeline.read,
                                                                               _columns(pipeline), None, decoder))
        except Exception as exc:
            if watch.fenced_by is not None:
                raise FencedAttempt(
                    f"batch {batch.id}: attempt {attempt} stopped early, the batch is now {watch.fenced_by}"
                ) from None
            invalid = [line for line in str(exc).splitlines() if INVALID_RECORD in line]
            if invalid:  # bad data: the same on every retry, so say which record and do not retry
                message = invalid[0][invalid[0].index(INVALID_RECORD):]
                raise InputError(without_sqlstate(message)) from None
            ours = raised_in_task(exc)
            if ours is not None:  # e.g. records deleted while a task read them: data loss, not a crash
                raise ours from None
            raise
        finally:
            spark.removeTag(batch_tag(batch.id))
            spark.removeTag(_lane_tag(batch))
            if shared:  # under Spark Connect round trips to the server
                records.unpersist()
                spark.sql(f"DROP VIEW IF EXISTS {_cached_read_view(batch)}")
            progress.close()
    return outputs, read_tasks, quarantined, schema_ids


def _observe_schema_ids(read, pipeline: Pipeline):
    """The read records, observed for the (range, schema id) pairs they hold when their values carry a
    Schema Registry id: Spark adds them up as the sinks' first action runs, no second pass."""
    if pipeline.record.format == "json" or pipeline.record.framing != "confluent":
        return read, None
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation("schema_ids")
    pairs = F.collect_set(F.struct("range_id", F.col(schema_id_column("value")).alias("schema_id")))
    return read.observe(observation, pairs.alias("pairs")), observation


def _schema_ids(observations: list, counts: dict, read_again: Callable) -> dict[int, list[int]]:
    """Per range, the ids of the schemas that wrote its values, from the observations of the reads that
    ran (the batch's, or its waves'). Spark Connect can answer an action without its observed metrics
    (seen under load): a range with decoded records and no id was then not observed, and one more read
    of the ranges finds its ids."""
    if not any(observations):
        return {}
    pairs = [pair for observation in observations for pair in observation.get.get("pairs") or ()]
    observed = {pair["range_id"] for pair in pairs}
    if any(c.records and range_id not in observed for range_id, c in counts.items()):
        log.warning("the read's schema ids were not observed; reading the ranges again for them")
        from pyspark.sql import functions as F

        pairs = read_again().select("range_id", F.col(schema_id_column("value")).alias("schema_id")).distinct().collect()
    found: dict[int, set[int]] = {}
    for pair in pairs:
        if pair["schema_id"] is not None:
            found.setdefault(pair["range_id"], set()).add(pair["schema_id"])
    return {range_id: sorted(ids) for range_id, ids in found.items()}


def _expressions(pipeline: Pipeline) -> list[str] | None:
    """Every expression of the pipeline's sinks; None when a sink takes whole records."""
    used = [sink.columns_used for sink in pipeline.sinks]
    if any(columns is None for columns in used):
        return None
    return [c.expr for columns in used for c in columns]


def _columns(pipeline: Pipeline) -> tuple[str, ...]:
    """The record columns the pipeline's expressions use (the reader builds only those)."""
    expressions = _expressions(pipeline)
    return ALL_COLUMNS if expressions is None else columns_used(expressions)


def _values(pipeline: Pipeline, decoder) -> str:
    """The values the batch's read ships (reader.VALUES): those it did not parse, unless an expression
    reads the value itself. Only a JSON decoder parses a chunk whole: with any other, every value is
    shipped, and so "unparsed" would only add their lengths."""
    expressions = _expressions(pipeline)
    if not isinstance(decoder, JsonFields) or expressions is None or "value" in expression_words(expressions):
        return "all"
    return "unparsed"


def value_decoder(pipeline: Pipeline, registry_config: Callable[[Pipeline], dict]):
    """The reader's decoder of the pipeline's values (None: Spark's from_json parses them all). A
    registry that refuses the credentials fails the batch here, before any task reads."""
    record = pipeline.record
    if record.format != "json":
        registry = None
        if record.uses_registry:
            from kafka_batch.formats import registry as schema_registry  # its client costs a JSON pipeline 0.1 s

            registry = registry_config(pipeline)
            schema_registry.check(registry)
        key = None if record.key is None else record.key.column(registry, "key")
        return Decoded(record.column(registry, "value"), key)
    plain = record.envelope is None  # an envelope's fields sit inside it: from_json parses those
    return JsonFields(pipeline.fields) if plain and parses_in_reader(pipeline.fields) else None


def _quarantine(spark, kafka: dict, decoder, tasks, pipeline: Pipeline, batch: batches.Batch,
                counts: dict) -> pa.Table | None:
    """The invalid records to quarantine, read again (with every column, the key and timestamp they
    keep) only when the sinks counted some; too many of them (over max_invalid_ratio) fail the
    batch, naming the first ones. The ranges are fixed, so the second read sees the same records."""
    invalid = sum(c.invalid for c in counts.values())
    if not invalid:
        return None
    records = parse_records(read_ranges(spark, kafka, tasks, pipeline.read, decoder=decoder), pipeline)
    rows = collect_arrow(invalid_records(records).orderBy("topic", "partition", "offset"))
    seen = sum(c.records + c.invalid for c in counts.values())
    limit = pipeline.limits.max_invalid_ratio
    if invalid / seen > limit:
        first = "; ".join(f"{r['topic']}[{r['partition']}] at offset {r['offset']}: {r['reason']}"
                          for r in rows.slice(0, 3).to_pylist())
        raise InputError(
            f"batch {batch.id}: {invalid} of {seen} records are invalid ({invalid / seen:.1%}, over max_invalid_ratio"
            f" {limit:g}); a schema change upstream? Nothing was committed. First: {first}"
        )
    return rows


def _record_failure(postgres: dict, pipeline: Pipeline, batch_id: int, attempt: int, exc: Exception) -> None:
    """Record why the attempt failed, on a fresh connection (the one that failed may be dead)."""
    try:
        conn = database.connect(postgres)
        try:
            # The message without Spark's traces: the batch's log holds them (status and the console show this).
            attempts.mark_failed(conn, batch_id, attempt, f"{type(exc).__name__}: {without_traces(str(exc))}")
        finally:
            conn.close()
    except Exception as again:  # noqa: BLE001 - the original error is the one to raise
        log.error("batch %s: could not record the failure of attempt %s: %s", batch_id, attempt, again)
    _discard_staging(postgres, pipeline, batch_id, attempt)


def _discard_staging(postgres: dict, pipeline: Pipeline, batch_id: int, attempt: int | None) -> None:
    """Best effort: what sinks staged for the attempt (None: every attempt) is no longer needed."""
    try:
        conn = database.connect(postgres)
        try:
            with database.transaction(conn) as cur:
                cur.execute("SET LOCAL lock_timeout = '5s'")
                for sink in pipeline.sinks:
                    sink.discard(cur, batch_id, attempt)
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - staging left behind is dropped by the next attempt or commit
        log.warning("batch %s: staging not dropped yet (%s)", batch_id, exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute one planned batch (spark-submit entry point).")
    parser.add_argument("--batch-id", required=True, type=int)
    parser.add_argument("--postgres-conn", required=True, help="the Airflow connection id of the pipeline's Postgres")
    parser.add_argument("--try-number", type=int, help="the Airflow try executing the batch, for the ledger")
    parser.add_argument("--mode", choices=["commit", "preview"], default="commit",
                        help="preview: a replay's dry run, stores the change it would make and commits nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        postgres = connections.postgres_params(connections.from_environment(args.postgres_conn))
        timings.mark("job_main")
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(f"kafka_batch:batch-{args.batch_id}").getOrCreate()
        timings.mark("session_ready")
        # No spark.stop(): spark-submit's JVM stops the SparkContext as it exits (a shutdown hook), while
        # pyspark's stop() would first wait up to a second for its accumulator server's handler to notice.
        result = run_batch(spark, postgres, args.batch_id, args.try_number, args.mode)
    except KafkaBatchError as exc:
        print(one_line(exc), file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        log.exception("batch %s failed", args.batch_id)
        print(one_line(exc), file=sys.stderr)
        return 1
    state = "was already committed" if result.already_committed else "committed" if args.mode == "commit" else "previewed"
    print(f"kafka_batch: batch {result.batch_id} {state}: {result.records} records", file=sys.stderr)
    return 0
