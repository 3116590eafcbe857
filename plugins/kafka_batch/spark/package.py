"""The kafka_batch package as a zip, shipped to wherever Spark runs the job's Python code.

spark-submit passes it with `--py-files`; a Spark Connect session adds it as an artifact. Either way
the executors import exactly the client's code.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Executors never import these (Airflow wiring, the command line, the driver's entry point).
_NOT_SHIPPED = ("airflow", "cli", "spark_jobs")


def package_zip(directory: Path) -> Path:
    """The kafka_batch package as a zip for --py-files, so executors import the same code."""
    target = directory / "kafka_batch.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            relative = path.relative_to(PACKAGE_DIR)
            if relative.parts[0] not in _NOT_SHIPPED:
                zf.write(path, Path("kafka_batch") / relative)
    return target
