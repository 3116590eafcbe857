"""A class-data-sharing archive for the JVM that spark-submit starts (the JDK's dynamic AppCDS).

A small batch's JVM spends most of its life loading and verifying Spark's classes: a trivial job took
13-16 s of wall time and 22 s of CPU on two cores, 7.5-8.6 s and 12.6 s with the archive. The first
successful spark-submit on a machine writes the classes it loaded to an archive
(`-XX:ArchiveClassesAtExit`, about 150 MB); later ones map it (`-XX:SharedArchiveFile`). The JVM checks
an archive against its own build and class path and ignores one that does not match, so the file
name also carries what it was made from, and a missing or stale one only costs the gain. Writing it
makes that first run about 15 s longer; runs that start meanwhile go without.

Only a JVM on this machine uses it: spark-submit's, which is the driver unless the Spark connection
deploys the driver to the cluster (`deploy-mode: cluster`); executors start as before.
`KAFKA_BATCH_JVM_ARCHIVE_DIR` says where archives live (default `~/.cache/kafka_batch`); `off`
turns this off.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka_batch.config import user_cache_dir

ENV = "KAFKA_BATCH_JVM_ARCHIVE_DIR"
OFF = "off"
# The JVM's notes on classes it cannot archive (signed jars, old class files) are not the job's news.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_dir() -> Path | None:
    configured = os.environ.get(ENV, "").strip()
    if configured.lower() == OFF:
        return None
    return Path(configured) if configured else user_cache_dir()


def archive_path(spark_env: dict[str, str]) -> Path | None:
    """The archive for the JVM and the Spark that spark-submit will use (`spark_env`: the variables it
    gets, submit.spark_environment): named after their paths and modification times, so an upgrade in
    place starts a new one."""
    directory = archive_dir()
    java_home = spark_env.get("JAVA_HOME") or os.environ.get("JAVA_HOME")
    spark_home = spark_env.get("SPARK_HOME") or os.environ.get("SPARK_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    if directory is None or java is None or spark_home is None:
        return None
    sources = [Path(java).resolve(), Path(spark_home, "jars").resolve()]
    stamp = "|".join(f"{path}:{path.stat().st_mtime_ns if path.exists() else 0}" for path in sources)
    return directory / f"spark-driver-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.jsa"


@contextmanager
def submit_opts(spark_env: dict[str, str], driver_is_local: bool, leading: str = "") -> Iterator[dict[str, str]]:
    """SPARK_SUBMIT_OPTS for one spark-submit: `leading` options, the caller's own (which win over
    them), then the archive's. Without an archive, the JVM writes one to a temporary file, moved into
    place only if the block ends without an error: a JVM killed while it writes leaves a partial file,
    which would be ignored on every later run."""
    path = archive_path(spark_env) if driver_is_local else None
    if path is None:
        yield _opts(leading)
        return
    if path.exists():
        yield _opts(leading, f"-XX:SharedArchiveFile={path}")
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only home: run without
        yield _opts(leading)
        return
    try:
        try:  # writing one costs a run about 15 s more: one writer at a time, the others run without
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield _opts(leading)
            return
        if path.exists():  # a writer finished between the check above and the lock
            yield _opts(leading, f"-XX:SharedArchiveFile={path}")
            return
        for stale in path.parent.glob(f"{path.stem}.*.partial"):  # of writers killed before the rename
            stale.unlink(missing_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")  # the JVM creates it at exit
        try:
            yield _opts(leading, f"-XX:ArchiveClassesAtExit={partial}")
            if partial.exists() and partial.stat().st_size:
                os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    finally:
        os.close(lock)  # releases the lock


def _opts(leading: str, archive_option: str = "") -> dict[str, str]:
    """`leading`, the caller's own SPARK_SUBMIT_OPTS (a JVM takes the last of a repeated option), then
    the archive's; nothing when there is nothing to add to the caller's."""
    own = os.environ.get("SPARK_SUBMIT_OPTS", "")
    archive = f"{archive_option} {QUIET}" if archive_option else ""
    if not (leading or archive):
        return {}
    return {"SPARK_SUBMIT_OPTS": " ".join(part for part in (leading, own, archive) if part)}
