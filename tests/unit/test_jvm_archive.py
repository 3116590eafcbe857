"""The spark-submit JVM's class archive: written once by a run that succeeded, then mapped by every
later run; a failed run leaves nothing behind, and a driver deployed to the cluster is left alone."""

from __future__ import annotations

import pytest

from kafka_batch.spark import jvm_archive


@pytest.fixture()
def spark_env(tmp_path, monkeypatch):
    java_home, spark_home = tmp_path / "jdk", tmp_path / "spark"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").touch()
    (spark_home / "jars").mkdir(parents=True)
    monkeypatch.setenv(jvm_archive.ENV, str(tmp_path / "archives"))
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Dmine=1")
    return {"JAVA_HOME": str(java_home), "SPARK_HOME": str(spark_home)}


def _option(env: dict, name: str) -> str:
    [value] = [opt.split("=", 1)[1] for opt in env["SPARK_SUBMIT_OPTS"].split() if opt.startswith(f"-XX:{name}=")]
    return value


def test_a_successful_run_writes_the_archive_and_later_runs_map_it(spark_env):
    with jvm_archive.submit_opts(spark_env, driver_is_local=True) as env:
        assert env["SPARK_SUBMIT_OPTS"].startswith("-Dmine=1 ")  # the caller's options come first
        partial = _option(env, "ArchiveClassesAtExit")
        open(partial, "wb").write(b"classes")  # what the JVM does as it exits
    archive = jvm_archive.archive_path(spark_env)
    assert archive.read_bytes() == b"classes"
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name, archive.stem + ".lock"]
    with jvm_archive.submit_opts(spark_env, driver_is_local=True) as env:
        assert _option(env, "SharedArchiveFile") == str(archive)


def test_a_failed_run_leaves_no_archive_not_even_a_partial_one(spark_env):
    with pytest.raises(RuntimeError), jvm_archive.submit_opts(spark_env, driver_is_local=True) as env:
        open(_option(env, "ArchiveClassesAtExit"), "wb").write(b"half")
        raise RuntimeError("spark-submit failed")
    killed = jvm_archive.archive_path(spark_env).with_suffix(".999999.partial")  # its writer was killed
    killed.write_bytes(b"half")
    with jvm_archive.submit_opts(spark_env, driver_is_local=True):
        assert not killed.exists()  # the next writer removes it
    assert [p.suffix for p in jvm_archive.archive_path(spark_env).parent.iterdir()] == [".lock"]


def test_while_one_run_writes_the_archive_others_run_without(spark_env):
    with jvm_archive.submit_opts(spark_env, driver_is_local=True) as writer:
        with jvm_archive.submit_opts(spark_env, driver_is_local=True) as other:
            assert other == {}
        open(_option(writer, "ArchiveClassesAtExit"), "wb").write(b"classes")
    with jvm_archive.submit_opts(spark_env, driver_is_local=True) as env:
        assert "SharedArchiveFile" in env["SPARK_SUBMIT_OPTS"]


def test_a_new_jvm_or_spark_gets_a_new_archive(spark_env, tmp_path):
    before = jvm_archive.archive_path(spark_env)
    (tmp_path / "spark" / "jars").rmdir()  # Spark reinstalled in place
    (tmp_path / "spark" / "jars").mkdir()
    assert jvm_archive.archive_path(spark_env) != before


@pytest.mark.parametrize("case", ["cluster driver", "turned off"])
def test_no_options_for_a_driver_elsewhere_or_when_turned_off(spark_env, monkeypatch, case):
    if case == "turned off":
        monkeypatch.setenv(jvm_archive.ENV, "off")
    with jvm_archive.submit_opts(spark_env, driver_is_local=case != "cluster driver") as env:
        assert env == {}


def test_an_archive_written_just_before_the_lock_is_mapped_not_written_again(spark_env, monkeypatch):
    archive = jvm_archive.archive_path(spark_env)
    lock = jvm_archive.fcntl.flock

    def another_writer_finishes_first(fd, op):
        archive.write_bytes(b"classes")  # after this run saw no archive, before it takes the lock
        lock(fd, op)

    monkeypatch.setattr(jvm_archive.fcntl, "flock", another_writer_finishes_first)
    with jvm_archive.submit_opts(spark_env, driver_is_local=True) as env:
        assert _option(env, "SharedArchiveFile") == str(archive)
