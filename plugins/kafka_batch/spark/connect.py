"""How a batch reaches a long-lived Spark Connect server: the execution mode for frequent small batches.

A pipeline whose Spark connection has the type `spark_connect` (the provider's SparkConnectHook
builds the `sc://` URL, with its token and SSL settings) skips spark-submit: the job's driver code
(`spark.job.run_batch`: load the plan, read, compute, the one commit transaction) runs in the
calling process (the Airflow task or the CLI), and its Spark work runs on the server. The job code
and the commit are the same as under spark-submit; what is saved is the JVM, the SparkContext and
cold Python workers of every batch (~20 s on this machine).

All clients of one package version share one server session (its id derives from the package's
content): Spark 4.2 keeps a Python worker daemon per Connect session until the server stops, so a
session per batch would leak one per batch, and a shared session keeps its workers warm. The
package travels as a session artifact, so the server runs exactly the client's code. A batch's Spark
operations carry a tag of their own, so cancelling one batch never touches another's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka_batch import connections, errors
from kafka_batch.connections import ConnectionFields
from kafka_batch.observability import timings
from kafka_batch.spark import collector
from kafka_batch.spark.package import package_zip

log = logging.getLogger("kafka_batch.connect")

CONN_TYPE = "spark_connect"
DEFAULT_PORT = 15002  # Spark Connect's
ANSWER_TIMEOUT_S = 10.0
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
_SESSION_NAMESPACE = uuid.UUID("5d0f3a8e-7b1c-4c2e-9a6f-2f1f6b0c9e41")
# Session settings every batch relies on (the server-wide ones, see spark.submit.SPARK_CONF, are the server's).
SESSION_CONF = {"spark.sql.session.timeZone": "UTC"}
# Set in the shared session once the package is added to it: later batches skip the upload.
PACKAGE_ADDED = "kafka_batch.package_added"


def uses_connect(spark: ConnectionFields | None) -> bool:
    return spark is not None and spark.conn_type == CONN_TYPE


def session_id(package: bytes) -> str:
    """The server session every client of this package version shares."""
    return str(uuid.uuid5(_SESSION_NAMESPACE, hashlib.sha256(package).hexdigest()))


def _answers(conn_id: str, url: str, timeout: float = ANSWER_TIMEOUT_S) -> None:
    """Refuse a server that does not accept a connection: pyspark's client would retry for minutes."""
    address = urllib.parse.urlsplit("http://" + url.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0])
    port = address.port or DEFAULT_PORT
    try:
        socket.create_connection((address.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise errors.ServiceError(f"Spark Connect ({conn_id}) did not answer at {address.hostname}:{port} within"
                                  f" {timeout:g}s: {exc.strerror or type(exc).__name__}") from None


def connection_url(spark: ConnectionFields) -> str:
    """The `sc://` URL of a `spark_connect` connection, as the provider's SparkConnectHook builds it from the
    same fields (host, port, login as user id, password as token, `use_ssl` in the extra). Importing the
    hook costs a command a second of Airflow; tests/unit/test_connections.py holds the two equal."""
    host = spark.host or ""
    if "://" not in host:
        host = f"sc://{host}"
    if spark.port:
        host = f"{host}:{spark.port}"
    url = urllib.parse.urlparse(host)
    if url.path:
        raise errors.InputError(f"connection {spark.conn_id!r}: a Spark Connect URL has no path, got {url.path!r}")
    params = [f"{name}={urllib.parse.quote(value)}" for name, value in (("user_id", spark.login),
                                                                         ("token", spark.password)) if value]
    if spark.extra.get("use_ssl") is not None:
        params.append(f"use_ssl={urllib.parse.quote(str(spark.extra['use_ssl']))}")
    return urllib.parse.urlunparse(("sc", url.netloc, "/", ";".join(params), "", url.fragment))


def session(spark_conn: ConnectionFields):
    """A session on the connection's server, with the package added (once per session: its first batch
    uploads it and marks the session; a changed package has another session id, so it takes effect)."""
    from pyspark.sql import SparkSession

    conn_id = spark_conn.conn_id
    url = connection_url(spark_conn)
    _answers(conn_id, url)
    with tempfile.TemporaryDirectory(prefix="kafka_batch_pyfiles_") as directory:
        package = package_zip(Path(directory))
        shared_id = session_id(package.read_bytes())
        try:
            spark = SparkSession.builder.remote(f"{url};session_id={shared_id}").getOrCreate()
            if spark.conf.get(PACKAGE_ADDED, None) != shared_id:  # once per session: the id is the package's
                _add_package(spark, package)
                spark.conf.set(PACKAGE_ADDED, shared_id)
        except Exception as exc:  # noqa: BLE001 - sorted below: a closed session, or no server
            if "SESSION_CLOSED" not in str(exc):
                raise errors.ServiceError(f"Spark Connect ({conn_id}) did not answer: {' '.join(str(exc).split())}") from None
            # The server timed the shared session out; it refuses that id until it restarts.
            log.warning("the shared Spark Connect session was closed by the server; using a new one")
            spark = SparkSession.builder.remote(url).create()
            spark.addArtifacts(str(package), pyfile=True)
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    return spark


def _add_package(spark, package: Path) -> None:
    """Add the package to the shared session. Two clients adding it at once (two batches starting after
    a deploy) race in the server's artifact manager, and the second's move finds the file there: the
    same bytes, since the session id is the package's hash, so that is success."""
    try:
        spark.addArtifacts(str(package), pyfile=True)
    except Exception as exc:
        if "FileAlreadyExistsException" not in str(exc):
            raise
        log.info("the package was added to the shared Spark Connect session by another client meanwhile")


@contextmanager
def connect_mode() -> Iterator[None]:
    """pyspark marks the process as a Spark Connect client in its environment (its functions dispatch
    on it); a spark-submit this process starts later (a CLI or bench run of another pipeline) must not
    inherit the mark, or its driver looks for a Connect server."""
    marked = _CONNECT_MODE in os.environ
    try:
        yield
    finally:
        if not marked:
            os.environ.pop(_CONNECT_MODE, None)


class ConnectExecution:
    """One batch through Spark Connect; `kill` interrupts only this batch's Spark operations."""

    def __init__(self, pipeline, batch_id: int, spark: ConnectionFields, postgres: ConnectionFields,
                 kafka: ConnectionFields, *, registry: ConnectionFields | None = None,
                 output: ConnectionFields | None = None, mode: str = "commit", try_number: int | None = None):
        self.pipeline = pipeline
        self.spark_conn = spark
        self.batch_id = batch_id
        self.postgres = connections.postgres_params(postgres)
        self.kafka = connections.kafka_config(kafka)
        self.registry = None if registry is None else connections.schema_registry_config(registry)
        self.output = self.kafka if output is None else connections.kafka_config(output)
        self.mode = mode
        self.try_number = try_number
        self._spark = None

    def run(self) -> None:
        with connect_mode():
            self._run()

    def _run(self) -> None:
        with collector.paused():  # the job's and Spark Connect's imports
            from kafka_batch.spark import job

            timings.mark("job_main")
            self._spark = spark = session(self.spark_conn)
        timings.mark("session_ready")
        try:
            job.run_batch(spark, self.postgres, self.batch_id, self.try_number, self.mode,
                          kafka_config=lambda _pipeline: self.kafka, registry_config=self._registry,
                          publish_config=lambda _pipeline: self.output)
        except Exception as exc:  # noqa: BLE001 - as under spark-submit: the kind, and the error the job recorded
            from kafka_batch.core.batches import recorded_error

            log.exception("batch %s failed", self.batch_id)
            kind = type(exc) if isinstance(exc, errors.KafkaBatchError) else errors.KafkaBatchError
            raise kind(f"batch {self.batch_id} failed: {recorded_error(self.postgres, self.batch_id)}") from None
        finally:
            spark.client.close()  # the channel only: the shared session stays for the next batch

    def _registry(self, pipeline) -> dict:
        if self.registry is None:  # the batch's snapshot uses a registry that the pipeline did not
            raise errors.InputError(f"batch {self.batch_id} reads a Schema Registry: define the connection"
                                    f" {pipeline.connections.schema_registry!r}")
        return self.registry

    def kill(self) -> None:
        from kafka_batch.spark.job import batch_tag

        if self._spark is not None:
            self._spark.interruptTag(batch_tag(self.batch_id))
