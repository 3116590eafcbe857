"""How `make bench` starts the peers: the commands, their jars, and the check that a peer's result is the
pipeline's.

Spark's peers (spark_peer.py) run with the connectors of kafka_batch_dev.spark_connectors: on the local
Spark Connect server (which has them on its classpath) or through spark-submit with the pipeline's own
settings (kafka_batch.spark.submit.SPARK_CONF, `local[*]`) and the connectors on `--jars`. The KafkaRDD
peer's helper (kafka_batch_peers/KafkaRddRows.java) is compiled here with the JDK's javac, against
pyspark's jars and the connectors, once per source.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kafka_batch.spark.submit import SPARK_CONF, java_home, spark_environment
from kafka_batch_dev import spark_connectors
from kafka_batch_dev.maven_jars import pyspark_home

HERE = Path(__file__).parent
SPARK_PEER = HERE / "spark_peer.py"
SOURCES = sorted((HERE / "kafka_batch_peers").glob("*.java"))


def _javac() -> str:
    home = java_home()
    return str(Path(home) / "bin" / "javac") if home else (shutil.which("javac") or "javac")


def compiled_jar(home: Path, sources: list[Path], classpath: list[Path], name: str) -> Path:
    """`sources` compiled against `classpath` into `<home>/peers/<name>-<hash of the sources>.jar`, once."""
    digest = hashlib.sha256(b"".join(s.read_bytes() for s in sources)).hexdigest()[:12]
    jar = home / "peers" / f"{name}-{digest}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kafka_batch_peers_") as classes:
        cp = ":".join(map(str, classpath))
        result = subprocess.run([_javac(), "-d", classes, "-cp", cp, *map(str, sources)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"javac of {', '.join(s.name for s in sources)} failed:\n{result.stderr[-3000:]}")
        staging = jar.with_suffix(".tmp")
        shutil.make_archive(str(staging), "zip", classes)
        Path(f"{staging}.zip").rename(jar)
    return jar


def spark_jars(home: Path) -> list[Path]:
    """The connectors, and the KafkaRDD helper compiled against them."""
    connectors = spark_connectors.install(home, spark_environment())
    rdd = [s for s in SOURCES if s.name == "KafkaRddRows.java"]
    helper = compiled_jar(home, rdd, [Path(pyspark_home(), "jars", "*"), *connectors], "kafka-rdd-rows")
    return [*connectors, helper]


def spark_peer_command(home: Path, mode: str, remote: str | None, kafka: dict, postgres: dict,
                       ranges: list[tuple[str, int, int, int]], table: str, **options: str) -> tuple[list[str], dict]:
    """(command, environment) of one Spark peer run: on the Spark Connect server at `remote`, else
    through spark-submit."""
    args = [str(SPARK_PEER), "--mode", mode, "--kafka", json.dumps(kafka), "--postgres", json.dumps(postgres),
            "--ranges", json.dumps(ranges), "--table", table,
            *[arg for key, value in options.items() for arg in (f"--{key}", value)]]
    if remote:
        return [sys.executable, *args, "--remote", remote], {}
    conf = {**SPARK_CONF, "spark.streaming.kafka.allowNonConsecutiveOffsets": "true"}  # transactions' markers
    submit = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[*]",
              "--jars", ",".join(map(str, spark_jars(home))),
              *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]]
    return [*submit, *args], spark_environment()


def same_rows(cur, expected: str, actual: str, columns: list[str]) -> int:
    """Rows of one table not in the other, both ways (0: the same result)."""
    cols = ", ".join(columns)
    cur.execute(f"SELECT count(*) FROM ((SELECT {cols} FROM {expected} EXCEPT ALL SELECT {cols} FROM {actual})"
                f" UNION ALL (SELECT {cols} FROM {actual} EXCEPT ALL SELECT {cols} FROM {expected})) differ")
    return cur.fetchone()[0]
