"""The embedded stack's process and permission handling, without starting Postgres or the broker
(tests/local/test_local_stack.py starts them)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kafka_batch_dev import local_stack

# A process that ignores SIGTERM, as the broker once did, with a child that ignores it too.
# argv: port to listen on (0: none), file to write the child's pid to.
STUBBORN = """
import signal, socket, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(child.pid))
import os; os.replace(sys.argv[2] + ".tmp", sys.argv[2])
if int(sys.argv[1]):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(sys.argv[1])))
    server.listen()
while True:
    time.sleep(1)
"""


def stubborn_command(port: int, child_pid_file: Path) -> list[str]:
    return [sys.executable, "-c", STUBBORN, str(port), str(child_pid_file)]


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def gone(pid: int) -> bool:
    """Independent of local_stack: no such process, or only a zombie waiting to be collected."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return raw[raw.rindex(")") + 2] in "ZX"


@pytest.fixture
def base():
    path = Path(tempfile.mkdtemp(prefix="kafka_batch_local_stack_"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def stubborn_broker(base):
    """A broker-like process in its own session that ignores SIGTERM, recorded in state.json as `up` does."""
    child_file = base / "child.pid"
    proc = subprocess.Popen(stubborn_command(0, child_file), start_new_session=True)
    child = int(wait_for_file(child_file))
    state = {"postgres_port": 1, "kafka_port": 1, "kafka_pid": proc.pid,
             "kafka_started": local_stack._proc_stat(proc.pid)[3]}
    (base / "state.json").write_text(json.dumps(state))
    yield proc, child
    for pid in (proc.pid, child):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def test_make_traversable_adds_the_search_bit_only_where_missing():
    with tempfile.TemporaryDirectory() as tmp:  # /tmp and / already let others search
        top = Path(tmp) / "a"
        middle = top / "b"
        bottom = middle / "c"
        bottom.mkdir(parents=True)
        top.chmod(0o700)
        middle.chmod(0o750)
        bottom.chmod(0o711)

        changed = local_stack._make_traversable(bottom / "initdb")

        assert changed == [Path(tmp), top, middle]  # mkdtemp makes 0700 directories
        assert [stat.S_IMODE(p.stat().st_mode) for p in (Path(tmp), top, middle, bottom)] == [
            0o701, 0o701, 0o751, 0o711]
        assert local_stack._make_traversable(bottom / "initdb") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the Postgres commands as another user")
def test_postgres_commands_run_with_the_users_own_group_and_no_other(monkeypatch):
    monkeypatch.setattr(local_stack, "PG_SYSTEM_USER", "nobody")  # exists everywhere: nothing is created
    nobody = pwd.getpwnam("nobody")

    out = local_stack._run_pg(["id", "-u"], "id").stdout.strip(), local_stack._run_pg(["id", "-G"], "id").stdout.split()

    assert out == (str(nobody.pw_uid), [str(nobody.pw_gid)])  # not gid 0, none of root's groups


def test_down_kills_a_broker_that_ignores_sigterm_with_its_whole_process_group(base, stubborn_broker, monkeypatch,
                                                                                capsys):
    monkeypatch.setattr(local_stack, "KAFKA_STOP_GRACE", 0.5)
    proc, child = stubborn_broker

    local_stack.down(base)

    assert gone(proc.pid) and gone(child)
    assert "ignored SIGTERM" in capsys.readouterr().err
    assert "kafka_pid" not in json.loads((base / "state.json").read_text())


def test_down_names_what_survives(base, stubborn_broker, monkeypatch):
    monkeypatch.setattr(local_stack, "KAFKA_STOP_GRACE", 0.2)
    monkeypatch.setattr(local_stack, "KILL_WAIT", 0.2)
    monkeypatch.setattr(local_stack, "_signal", lambda pids, groups, sig: None)  # as if SIGKILL had no effect
    proc, child = stubborn_broker

    with pytest.raises(RuntimeError, match="survived SIGKILL") as raised:
        local_stack.down(base)

    assert f"the Kafka broker: pid {min(proc.pid, child)} (" in str(raised.value)
    assert f"pid {max(proc.pid, child)} (" in str(raised.value)
    assert json.loads((base / "state.json").read_text())["kafka_pid"] == proc.pid  # still known, for a retry


def test_down_leaves_alone_a_process_that_reused_the_brokers_pid(base, stubborn_broker):
    proc, child = stubborn_broker
    state = json.loads((base / "state.json").read_text())
    (base / "state.json").write_text(json.dumps({**state, "kafka_started": state["kafka_started"] - 1}))

    local_stack.down(base)

    assert not gone(proc.pid) and not gone(child)


def test_up_says_a_failure_in_one_line_without_a_traceback(monkeypatch, capsys):
    def failing(**options):
        raise RuntimeError("the Kafka broker exited with 1; log /x/kafka.log")

    monkeypatch.setattr(local_stack, "up", failing)
    assert local_stack.main(["up"]) == 1
    assert capsys.readouterr().err == "kafka-batch local up: error: the Kafka broker exited with 1; log /x/kafka.log\n"


def test_the_kafka_security_stays_what_the_local_data_was_made_with(tmp_path, monkeypatch):
    monkeypatch.delenv(local_stack.KAFKA_SECURITY_VARIABLE, raising=False)
    assert local_stack._requested_security(tmp_path, None, {}) == "none"  # nothing made yet: the default
    assert local_stack._requested_security(tmp_path, "sasl_ssl", {}) == "sasl_ssl"
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "meta.properties").touch()  # a node formatted (its SCRAM users with it)
    assert local_stack._requested_security(tmp_path, None, {"kafka_security": "sasl_ssl"}) == "sasl_ssl"
    with pytest.raises(RuntimeError, match="made with security none and its data is kept"):
        local_stack._requested_security(tmp_path, "sasl_ssl", {})
    monkeypatch.setenv(local_stack.KAFKA_SECURITY_VARIABLE, "tls")
    with pytest.raises(RuntimeError, match="security is none or sasl_ssl, not 'tls'"):
        local_stack._requested_security(tmp_path, None, {})


def test_env_sh_gives_a_shell_the_connections_and_the_virtualenvs_commands(tmp_path):
    """The guide's first step: after `source .local/env.sh`, `kafka-batch` and `airflow` are the venv's,
    and sourcing it twice puts them on PATH once."""
    bin_dir = Path(sys.executable).parent
    local_stack.write_env_file(tmp_path, {"AIRFLOW_CONN_X": "it's {\"a\": 1}", "KAFKA_BATCH_LOG_DIR": str(tmp_path / "logs")})
    assert oct((tmp_path / "env.sh").stat().st_mode & 0o777) == "0o600"
    shell = subprocess.run(
        ["bash", "-c", f"source {tmp_path}/env.sh && source {tmp_path}/env.sh && command -v kafka-batch airflow"
                       f" && echo \"$AIRFLOW_CONN_X\" && echo \"$PATH\""],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    kafka_batch, airflow, conn, path = shell.stdout.splitlines()
    assert (kafka_batch, airflow) == (str(bin_dir / "kafka-batch"), str(bin_dir / "airflow"))
    assert conn == "it's {\"a\": 1}"
    assert path.split(":").count(str(bin_dir)) == 1


def test_a_kafka_node_takes_the_environments_jvm_performance_options_in_place_of_kafkas_as_its_scripts_do(
        monkeypatch, tmp_path):
    from kafka_batch_dev import kafka_broker

    config = tmp_path / "server.properties"
    monkeypatch.delenv(kafka_broker.PERFORMANCE_OPTIONS_VARIABLE, raising=False)
    default = kafka_broker.node_command(tmp_path, config, None)
    assert "-XX:+UseG1GC" in default and "-XX:+UseSerialGC" not in default
    monkeypatch.setenv(kafka_broker.PERFORMANCE_OPTIONS_VARIABLE, " -XX:TieredStopAtLevel=1  -XX:+UseSerialGC ")
    chosen = kafka_broker.node_command(tmp_path, config, None)
    assert "-XX:+UseG1GC" not in chosen and chosen[1:5] == ["-Xmx1g", "-Xms256m", "-XX:TieredStopAtLevel=1",
                                                              "-XX:+UseSerialGC"]
    assert chosen[-2:] == [kafka_broker.MAIN_CLASS, str(config)]
