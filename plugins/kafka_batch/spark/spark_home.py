"""SPARK_HOME for this interpreter's pip-installed pyspark, without the zipped copy of its Python code.

Spark puts `SPARK_HOME/python/lib/pyspark.zip` (and py4j's zip) first on the PYTHONPATH of the driver
and of every Python worker daemon it starts. Python keeps no compiled bytecode for modules it imports
from a zip, so each of those processes compiles pyspark from source: 0.6-0.9 s per process on this
machine, against 0.15-0.2 s from the installed package. A pip-installed pyspark holds the same code
installed (and compiled), so spark-submit gets a view of it instead: a directory in the user's cache
with links to everything in it but `python/`. The zips' paths then do not exist, Python skips them and
imports the installed pyspark and py4j. A SPARK_HOME of your own is used as it is, and so is the
package for a YARN master, which uploads those zips to its containers (`execution.batch_execution`).
Making a view removes those of a pyspark that is gone, so deleted checkouts leave nothing behind.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from kafka_batch.config import user_cache_dir

ZIPPED_PYTHON = "python"  # python/lib/pyspark.zip, python/lib/py4j-*.zip


def without_zipped_python(package_dir: Path) -> Path:
    """The view of the pyspark package at `package_dir` (made on first use), or the package itself
    when the cache cannot be written: slower to start, nothing else."""
    package_dir = package_dir.resolve()
    try:
        stamp = f"{package_dir}:{(package_dir / 'version.py').stat().st_mtime_ns}"  # a reinstall: a new view
        view = user_cache_dir() / f"spark-home-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"
        if view.is_dir():
            return view
        view.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=view.parent))
        staging.chmod(0o755)
        for entry in package_dir.iterdir():
            if entry.name != ZIPPED_PYTHON:
                (staging / entry.name).symlink_to(entry)
        try:
            staging.rename(view)  # complete or not there: a process that starts meanwhile sees no half view
        except OSError:  # another process renamed its own first
            shutil.rmtree(staging, ignore_errors=True)
        _remove_views_of_removed_packages(view.parent)
    except OSError:
        return package_dir
    return view if view.is_dir() else package_dir


def _remove_views_of_removed_packages(directory: Path) -> None:
    """Views whose pyspark is gone (a deleted virtualenv or checkout) point nowhere: remove them."""
    for other in directory.glob("spark-home-*"):
        jars = other / "jars"
        if jars.is_symlink() and not jars.exists():
            shutil.rmtree(other, ignore_errors=True)
