"""Tests that run DAGs through Airflow (dag.test(), `airflow dags test`, a scheduler). Under pytest-xdist
they all run on one worker (tests/conftest.py), and each holds the session's Airflow (helpers.airflow_alone)."""

from __future__ import annotations

import pytest

from tests.integration.helpers import airflow_alone


@pytest.fixture
def dag_runs_alone(services):
    with airflow_alone():
        yield
