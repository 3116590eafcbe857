"""A set of jars from Maven Central, resolved once into the local home by a standard resolver.

Maven when `mvn` is on PATH (`dependency:copy-dependencies` of a generated POM), else the Ivy resolution
that ships with pyspark (`spark-submit --packages`). The jars land in a directory of their own, complete
or not there (a marker file is written last), so a second install downloads nothing. Apache Kafka's
broker (kafka_broker) and Spark's Kafka connectors (spark_connectors) are resolved this way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

COMPLETE = ".complete"  # written last: a directory without it is a cut-short install


@dataclass(frozen=True)
class JarSet:
    """`artifacts` (group:artifact:version) and their runtime dependencies, in `<home>/<directory>`
    (`<name>/libs`, Ivy's cache beside it in `<name>/ivy`); `required`: a file name pattern the resolution must leave, or it failed."""

    what: str
    directory: str
    artifacts: tuple[str, ...]
    required: str

    def libs(self, home: Path) -> Path:
        return home / self.directory

    def installed(self, home: Path) -> bool:
        return (self.libs(home) / COMPLETE).exists()

    def jars(self, home: Path) -> list[Path]:
        return sorted(self.libs(home).glob("*.jar"))

    def install(self, home: Path, java_env: dict[str, str] | None = None, keep=lambda jar: True) -> Path:
        """The jars in `libs(home)`, resolved once; the directory. `keep(path)`: whether a resolved jar
        stays (those its user already has on its classpath may go)."""
        target = self.libs(home)
        if self.installed(home):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".libs-", dir=target.parent))
        try:
            if shutil.which("mvn"):
                self._resolve_with_maven(staging)
            else:
                self._resolve_with_ivy(staging, target.parent / "ivy", java_env or {})
            if not any(staging.glob(self.required)):
                raise RuntimeError(f"resolving {self.what} left no {self.required} in {staging}")
            for jar in staging.glob("*.jar"):
                if not keep(jar):
                    jar.unlink()
            (staging / COMPLETE).write_text(" ".join(self.artifacts) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def _pom(self) -> str:
        dependencies = "".join(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>"
            "</dependency>" for group, artifact, version in (coordinate.split(":") for coordinate in self.artifacts))
        return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
                f"<groupId>kafka-batch.local</groupId><artifactId>{self.directory.split('/')[0]}</artifactId>"
                f"<version>1</version><packaging>pom</packaging><dependencies>{dependencies}</dependencies></project>\n")

    def _resolve_with_maven(self, target: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="kafka_batch_pom_") as work:
            (Path(work) / "pom.xml").write_text(self._pom())
            self._run(["mvn", "-B", "-q", "-f", str(Path(work) / "pom.xml"), "dependency:copy-dependencies",
                       "-DincludeScope=runtime", f"-DoutputDirectory={target}"], "Maven")

    def _resolve_with_ivy(self, target: Path, ivy_home: Path, java_env: dict[str, str]) -> None:
        """spark-submit resolves `--packages` with Ivy into `ivy_home`/jars before it runs the application
        (here one that does nothing). Ivy leaves out scala-library, which Spark always excludes since its
        own is on its classpath: a set run outside Spark takes that one, pyspark's."""
        with tempfile.TemporaryDirectory(prefix="kafka_batch_ivy_") as work:
            noop = Path(work) / "resolve_only.py"
            noop.write_text("")
            spark_submit = str(Path(sys.executable).parent / "spark-submit")
            self._run([spark_submit, "--master", "local[1]", "--conf", f"spark.jars.ivy={ivy_home}",
                       "--packages", ",".join(self.artifacts), str(noop)],
                      "Spark's Ivy resolution (spark-submit --packages)", env={**os.environ, **java_env})
        scala = sorted(Path(java_env.get("SPARK_HOME") or pyspark_home()).glob("jars/scala-library-2.13.*.jar"))
        if not scala:
            raise RuntimeError(f"no scala-library 2.13 among pyspark's jars for {self.what}")
        for jar in [*(ivy_home / "jars").glob("*.jar"), scala[-1]]:
            shutil.copy2(jar, target / jar.name)

    def _run(self, command: list[str], resolver: str, env: dict[str, str] | None = None) -> None:
        print(f"kafka-batch local: fetching {self.what} with {resolver}", file=sys.stderr)
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)  # a slow mirror
        if result.returncode != 0:
            raise RuntimeError(f"{resolver} could not fetch {self.what} (exit {result.returncode}):\n"
                               f"{result.stdout[-3000:]}{result.stderr[-3000:]}")


def pyspark_home() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent)
