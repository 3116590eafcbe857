"""The processes a batch runs in, sampled: peak memory and CPU seconds by kind, and the phases of its
timings marks."""

from __future__ import annotations

import resource
import threading

import psutil

from kafka_batch_dev import local_stack


class ProcessSampler:
    """What a command and the services it uses cost while it runs: CPU seconds and peak RSS.

    CPU seconds (`cpu_seconds()`), by who pays:
      command   the processes this one starts and waits for (the CLI, spark-submit's JVM and its Python
                workers; a peer's whole process), exactly: the kernel's account of reaped children
      server    the Spark Connect server's JVM and its Python workers (with `connect`), sampled
      broker    the Kafka nodes' JVMs, sampled
      postgres  the postmaster and its backends: the live ones sampled, those that end meanwhile (a
                connection's backend) through the postmaster's account of its reaped children
    and, sampled, where the command's and the server's went: driver (the CLI or run_batch.py), jvm and
    worker (Spark's Python workers). Sampling is every 0.1 s: a process that starts and ends between two
    samples is missed there (not in `command`). The pipeline's (or a Spark peer's) CPU is command + server.
    Peak RSS (`peaks`) by kind: driver, jvm, worker, broker, postgres."""

    KINDS = ("driver", "jvm", "worker", "broker", "postgres")

    def __init__(self, connect: bool):
        self.peaks = dict.fromkeys(self.KINDS, 0)
        self._cpu: dict[int, tuple[str, str, float, float]] = {}  # pid -> (kind, payer, first seen, last seen)
        state = local_stack.read_state()
        self._brokers = set(local_stack.kafka_node_pids(state).values())
        self._server = state.get("spark_connect_pid") if connect else None
        self._postmaster = local_stack.postmaster_pid(local_stack.home() / "postgres")
        self._reaped_by_postmaster: list[float] = []  # its children's CPU, at the first and the last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._command = (children.ru_utime + children.ru_stime) - (self._children.ru_utime + self._children.ru_stime)

    def cpu_seconds(self) -> dict[str, float]:
        used = dict.fromkeys(("command", "server", "broker", "postgres", "driver", "jvm", "worker"), 0.0)
        used["command"] = self._command
        for kind, payer, first, last in self._cpu.values():
            if payer != "command":
                used[payer] += last - first
            if kind in ("driver", "jvm", "worker"):
                used[kind] += last - first
        if len(self._reaped_by_postmaster) == 2:
            used["postgres"] += self._reaped_by_postmaster[1] - self._reaped_by_postmaster[0]
        return {kind: round(seconds, 2) for kind, seconds in used.items()}

    def _processes(self) -> list[tuple[psutil.Process, str]]:
        found = [(p, "command") for p in psutil.Process().children(recursive=True)]
        roots = [(pid, "broker") for pid in self._brokers] + [(self._server, "server"), (self._postmaster, "postgres")]
        for pid, payer in roots:
            if pid is None:
                continue
            try:
                root = psutil.Process(pid)
                found += [(p, payer) for p in (root, *root.children(recursive=True))]
            except psutil.Error:
                continue
        return found

    def _kind(self, p: psutil.Process, cmd: str, payer: str) -> str | None:
        if payer in ("broker", "postgres"):
            return payer
        if "java" in p.name():
            return "jvm"
        if "run_batch.py" in cmd or " run --pipeline" in cmd:
            return "driver"
        if "pyspark" in cmd and ("daemon" in cmd or "worker" in cmd):
            return "worker"
        return None  # a launcher script, a peer's Python process: in `command`, not sampled

    def _sample(self, first: bool = False) -> None:
        for p, payer in self._processes():
            try:  # a process may end between the listing and its reading
                cmd = " ".join(p.cmdline())
                rss, times = p.memory_info().rss, p.cpu_times()
                kind = self._kind(p, cmd, payer)
            except psutil.Error:
                continue
            if kind is None:
                continue
            self.peaks[kind] = max(self.peaks[kind], rss)
            used = times.user + times.system
            seen = self._cpu.get(p.pid)
            self._cpu[p.pid] = (kind, payer, used if first else 0.0, used) if seen is None else (kind, payer, seen[2], used)
            if p.pid == self._postmaster:
                reaped = times.children_user + times.children_system
                self._reaped_by_postmaster = [reaped] if first else [self._reaped_by_postmaster[0], reaped]

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()


def own_cpu(cpu: dict[str, float]) -> float:
    """A batch's (or a peer's) own CPU seconds from ProcessSampler.cpu_seconds(): its command's and the Spark
    Connect server's, not the broker's or Postgres'."""
    return cpu["command"] + cpu["server"]


def phases(marks: list[dict], spawned: float | None = None, ended: float | None = None) -> dict[str, float]:
    """Seconds per phase from the marks of the CLI, the driver and the read tasks."""
    first = {}
    for m in marks:
        first.setdefault(m["event"], m["t"])
    task_starts = [m["t"] for m in marks if m["event"] == "task_start"]
    task_ends = [m["t"] for m in marks if m["event"] == "task_end"]
    t = dict(first, task_start=min(task_starts, default=None), task_end=max(task_ends, default=None))
    steps = [
        ("process start", spawned, t.get("cli_start")), ("plan", t.get("plan_start"), t.get("plan_done")),
        ("spark-submit call built", t.get("submit_prepare"), t.get("submit_start")),
        ("JVM + driver start", t.get("submit_start"), t.get("job_main")),
        ("Spark session", t.get("job_main"), t.get("session_ready")),
        ("load batch + plan tasks", t.get("session_ready"), t.get("read_start")),
        ("first task start", t.get("read_start"), t.get("task_start")),
        ("read (tasks)", t.get("task_start"), t.get("task_end")),
        ("aggregate to driver", t.get("task_end"), t.get("computed")),
        ("commit", t.get("commit_start"), t.get("commit_done")),
        ("stop + exit", t.get("commit_done"), ended or t.get("submit_done")),
    ]
    return {name: round(b - a, 2) for name, a, b in steps if a is not None and b is not None}
