"""spark-submit's view of a pip-installed pyspark: Spark's layout without the zipped Python code, so
the driver and the Python workers import the installed, compiled pyspark."""

from __future__ import annotations

import shutil
from pathlib import Path

from kafka_batch.spark import spark_home


def _package(root: Path) -> Path:
    package = root / "site-packages" / "pyspark"
    for directory in ("bin", "jars", "sbin", "python/lib"):
        (package / directory).mkdir(parents=True)
    (package / "python/lib/pyspark.zip").write_bytes(b"PK")
    (package / "bin/spark-submit").write_text("#!/bin/sh\n")
    (package / "version.py").write_text('__version__ = "4.2.0"\n')
    return package


def test_the_view_links_spark_but_not_its_zipped_python_and_is_made_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    package = _package(tmp_path)
    view = spark_home.without_zipped_python(package)
    assert view.parent == tmp_path / "cache" / "kafka_batch"
    assert (view / "bin/spark-submit").read_text() == "#!/bin/sh\n" and (view / "jars").resolve() == package / "jars"
    assert not (view / "python/lib/pyspark.zip").exists()  # so Python falls through to the installed package
    assert spark_home.without_zipped_python(package) == view
    assert [p.name for p in view.parent.iterdir()] == [view.name]  # no staging directory left


def test_a_cache_it_cannot_write_means_the_package_itself(tmp_path, monkeypatch):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the directory would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    package = _package(tmp_path)
    assert spark_home.without_zipped_python(package) == package.resolve()


def test_spark_submit_gets_the_view_unless_you_set_spark_home(tmp_path, monkeypatch):
    from kafka_batch.spark import submit

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    home = Path(submit.spark_environment()["SPARK_HOME"])
    assert home.parent == tmp_path / "cache" / "kafka_batch" and (home / "jars").is_dir()
    assert not (home / "python").exists()
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert "SPARK_HOME" not in submit.spark_environment()  # yours, inherited as it is


def test_views_of_removed_packages_are_removed_when_a_new_view_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gone = spark_home.without_zipped_python(_package(tmp_path / "old-venv"))
    kept = spark_home.without_zipped_python(_package(tmp_path / "other-venv"))
    shutil.rmtree(tmp_path / "old-venv")  # its virtualenv deleted
    new = spark_home.without_zipped_python(_package(tmp_path / "new-venv"))
    assert sorted(p.name for p in new.parent.iterdir()) == sorted([kept.name, new.name])
    assert not gone.exists()


def test_spark_submits_launcher_jvm_starts_with_c1_and_your_options_after(monkeypatch):
    from kafka_batch.spark import submit

    monkeypatch.delenv("SPARK_LAUNCHER_OPTS", raising=False)
    assert submit.spark_environment()["SPARK_LAUNCHER_OPTS"] == submit.LAUNCHER_JVM
    monkeypatch.setenv("SPARK_LAUNCHER_OPTS", "-XX:+UseParallelGC")  # yours win: a JVM takes the last
    assert submit.spark_environment()["SPARK_LAUNCHER_OPTS"] == f"{submit.LAUNCHER_JVM} -XX:+UseParallelGC"
    monkeypatch.setenv("SPARK_LAUNCHER_OPTS", submit.launcher_options())  # an environment made from ours
    assert submit.spark_environment()["SPARK_LAUNCHER_OPTS"] == f"{submit.LAUNCHER_JVM} -XX:+UseParallelGC"
