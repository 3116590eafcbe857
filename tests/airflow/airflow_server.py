"""A real Airflow for the console tests, started as `make airflow` starts it: on a free loopback port, with
the project's plugin, the simple auth manager (its admin user and generated password) and the test
services' connections. Stopped at the end; nothing is left listening.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka_batch_dev import local_stack
from kafka_batch_dev.airflow_api import Server


@contextmanager
def airflow(extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """Airflow as `make airflow` starts it (api-server, scheduler, dag-processor, triggerer), on the test
    services and a free loopback port; every component is stopped at the end."""
    base = Path(os.environ["AIRFLOW_HOME"]).parent
    state = local_stack.read_state(base)
    state["airflow_port"] = local_stack.free_port()
    connections = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_")}
    try:
        url = local_stack.start_airflow(base, state, {**connections, **(extra_env or {})})
        yield Server(url, *local_stack.airflow_login(base), base / "airflow-api-server.log")
    finally:
        left = local_stack.stop_airflow(state)
        assert not left, f"Airflow processes survived: {left}"
