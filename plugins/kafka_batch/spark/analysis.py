"""A definition's expressions, resolved by Spark's own analyzer before a batch is planned.

Every expression a sink evaluates (group keys, measures, columns, keys, values, a version, `delete_when`)
is analyzed against an empty frame of the pipeline's parsed records: the record's fields and metadata
columns with their types, as the job builds them (`transform.expression_scope`), and cast to the type
its column takes. A name that does not resolve, a syntax error or a cast Spark refuses is one line that
names the file, the field's path, the name and the close ones Spark suggests: exit 2, nothing planned
(a typo used to pass planning and fail the batch in Spark, with a JVM trace).

Spark is the pipeline's own: its Spark Connect server (a round trip per question), or for spark-submit
pipelines a local session started in this process (the JVM's start, seconds; one not started within
LOCAL_START_SECONDS is a retried service error, since pyspark would wait for it forever). A verdict that
passed is remembered in Postgres by a hash of what it depends on (`analysis_key`), so only the first plan
of each record layout and set of expressions pays it. A registry schema that changes under an unchanged
definition is not analyzed again: a field it dropped fails the batch at run time.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kafka_batch import connections
from kafka_batch.config import Pipeline, log_dir
from kafka_batch.connections import ConnectionFields
from kafka_batch.core.database import apply_migrations, transaction
from kafka_batch.errors import InputError, ServiceError, without_traces

log = logging.getLogger("kafka_batch.analysis")

CLOSE_NAMES = 3  # of Spark's suggestions, the closest
# A local session starts in seconds (the JVM, Spark's classes); one that has not started in two minutes
# will not.
LOCAL_START_SECONDS = 120


def check_expressions(conn, pipeline: Pipeline, spark: ConnectionFields | None,
                      registry: ConnectionFields | None) -> None:
    """Refuse, with InputError, a definition whose expressions Spark cannot resolve; remember one it can.
    `spark`: the pipeline's Spark connection (None: spark-submit's defaults); `registry`: its Schema
    Registry's, for a pipeline that reads through one."""
    if not pipeline.expressions():
        return
    apply_migrations(conn)
    key = analysis_key(pipeline)
    if _analyzed(conn, key):
        return
    registry_config = None if registry is None else connections.schema_registry_config(registry)
    with _session(spark) as session:
        problems = unresolved(session, pipeline, registry_config)
    if problems:
        raise InputError(f"pipeline {pipeline.name!r} ({pipeline.source}): {'; '.join(problems)}")
    _remember(conn, key)


def analysis_key(pipeline: Pipeline) -> str:
    """What the analyzer's verdict depends on, hashed: the record's section (its fields and their types),
    each expression with the type it is cast to, and Spark's version; not the name, topics, tables,
    limits or schedule, so a definition that changes only those is not analyzed again."""
    subject = {"record": pipeline.definition.get("record"), "spark": _spark_version(),
               "expressions": sorted({(c.expr, c.spark_type) for _, c in pipeline.expressions()})}
    return hashlib.sha256(json.dumps(subject, sort_keys=True, default=str).encode()).hexdigest()


def unresolved(spark, pipeline: Pipeline, registry_config: dict | None = None) -> list[str]:
    """What Spark's analyzer says of each expression it refuses, as `<path>: <why>`: all of them are
    asked at once, and one by one only when that fails."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    from kafka_batch.spark.job import value_decoder
    from kafka_batch.spark.reader import ALL_COLUMNS, record_schema
    from kafka_batch.spark.transform import expression_scope

    decoder = value_decoder(pipeline, lambda _pipeline: registry_config)
    scope = expression_scope(spark.createDataFrame([], record_schema(ALL_COLUMNS, decoder)), pipeline)
    expressions = pipeline.expressions()

    def analyzed(*columns):
        """Spark analyzes a plan when asked its schema (classic pyspark already at `select`)."""
        return scope.select(*[F.expr(c.expr).cast(c.spark_type).alias(f"e{i}") for i, c in enumerate(columns)]).schema

    with _quiet():
        try:
            analyzed(*(column for _, column in expressions))
            return []
        except AnalysisException:
            pass
        problems = []
        for path, column in expressions:
            try:
                analyzed(column)
            except AnalysisException as exc:
                problems.append(f"{path}: {_said(column.expr, exc)}")
    return problems


def _said(expression: str, exc) -> str:
    """Spark's refusal in a phrase: the name and the close ones for an unresolved name or function, else
    the first line of its message without its condition, SQLSTATE and plan."""
    condition = exc.getCondition() or ""
    given = exc.getMessageParameters() or {}
    if condition.startswith(("UNRESOLVED_COLUMN", "UNRESOLVED_ROUTINE")):
        name = given.get("objectName") or given.get("routineName") or "?"
        where = "" if name.strip("`") == expression.strip() else f" in {expression!r}"
        if condition.startswith("UNRESOLVED_ROUTINE"):
            return f"{name}{where} is not a Spark SQL function"
        # Spark ranks its proposals by edit distance; a typo's intended name is the most alike.
        proposals = [n.strip() for n in given.get("proposal", "").split(",") if n.strip()]
        close = sorted(proposals, key=lambda n: -difflib.SequenceMatcher(None, n.strip("`"), name.strip("`")).ratio())
        close = close[:CLOSE_NAMES]
        return (f"{name}{where} is not a field or metadata column of the record"
                + (f" (close: {', '.join(close)})" if close else ""))
    first = re.sub(r"^\[[A-Z_.]+\]\s*", "", without_traces((str(exc).strip().splitlines() or [condition])[0]))
    return f"{expression!r}: {first[:1].lower()}{first[1:]}"


@contextmanager
def _quiet() -> Iterator[None]:
    """pyspark logs every analysis error it raises, with the JVM's trace: the caller says it in one line."""
    loggers = pyspark_error_loggers()
    saved = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, saved, strict=True):
            logger.disabled = disabled


def pyspark_error_loggers() -> list[logging.Logger]:
    """pyspark's loggers of the errors it raises (each logged with its traces), made as pyspark makes them:
    a plain Logger made first under their names fails pyspark's later calls, which pass keywords only
    PySparkLogger takes."""
    from pyspark.logger import PySparkLogger

    return [PySparkLogger.getLogger(name) for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]


def _spark_version() -> str:
    """pyspark's version (the full package, or the client alone), without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("pyspark", "pyspark-client"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "unknown"


@contextmanager
def _session(spark: ConnectionFields | None) -> Iterator:
    """A Spark session to ask: the pipeline's Spark Connect server, or a local one in this process."""
    from kafka_batch.spark import connect

    if connect.uses_connect(spark):
        with connect.connect_mode():
            session = connect.session(spark)
            try:
                yield session
            finally:
                session.client.close()  # the channel only: the shared session stays
        return
    import os

    from pyspark.sql import SparkSession

    from kafka_batch.spark.submit import spark_environment

    for key, value in spark_environment().items():
        os.environ.setdefault(key, value)
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / "analysis-jvm.log"
    log.info("starting a local Spark session to analyze the definition's expressions (its log: %s)", output)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connections' lines, at exit too
    # Its catalog's default database is a directory: a throwaway one, not spark-warehouse/ in the user's
    # working directory.
    with tempfile.TemporaryDirectory(prefix="kafka_batch_analysis_") as warehouse:
        builder = (SparkSession.builder.master("local[1]").appName("kafka_batch analysis")
                   .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
                   .config("spark.driver.memory", "512m").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1").config("spark.sql.warehouse.dir", warehouse))
        with open(output, "ab") as jvm_log, _stderr_to(jvm_log):  # the JVM's lines go there, not to the terminal
            session = _started(builder, output)
        try:
            yield session
        finally:
            _stop_local(session)


def _started(builder, output) -> object:
    """The local session, or a retried service error once LOCAL_START_SECONDS have passed: pyspark waits
    for the JVM it launched without a bound. A session still starting then is left to a daemon thread;
    its JVM ends with this process (it exits when its standard input, a pipe from here, closes)."""
    started: dict = {}

    def start() -> None:
        try:
            started["session"] = builder.getOrCreate()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            started["error"] = exc

    thread = threading.Thread(target=start, name="kafka_batch-local-spark", daemon=True)
    thread.start()
    thread.join(LOCAL_START_SECONDS)
    if thread.is_alive():
        raise ServiceError(f"the local Spark session that analyzes the expressions did not start within "
                           f"{LOCAL_START_SECONDS} s (its log: {output})")
    if "error" in started:
        raise started["error"]
    return started["session"]


def _stop_local(session) -> None:
    """Stop the local session and its JVM (which lives until its gateway's pipe closes): a spark-submit
    batch that follows in this process starts a JVM of its own."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    session.stop()
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        process.stdin.close()  # the JVM's signal to exit
        try:
            process.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it exits with this process at the latest
            log.warning("the local Spark session's JVM did not exit within 30 s")
    SparkContext._gateway = SparkContext._jvm = None


@contextmanager
def _stderr_to(file) -> Iterator[None]:
    """This process's standard error (file descriptor 2, which the JVM pyspark starts inherits) goes to
    `file` while the block runs."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _analyzed(conn, key: str) -> bool:
    with transaction(conn) as cur:
        cur.execute("SELECT 1 FROM kafka_batch.analyzed_definitions WHERE hash = %s", (key,))
        return cur.fetchone() is not None


def _remember(conn, key: str) -> None:
    with transaction(conn) as cur:
        cur.execute("INSERT INTO kafka_batch.analyzed_definitions (hash) VALUES (%s) ON CONFLICT DO NOTHING",
                    (key,))
