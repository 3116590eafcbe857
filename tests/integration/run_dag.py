"""Run one DAG run through Airflow with a stable run id: `python -m tests.integration.run_dag DAG_ID DATE [CONF]`.

Like `airflow dags test`, but the run id is derived from the logical date only, so running it again
with the same date re-runs the same run (same run id), as clearing a run in the UI does.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

from airflow.utils.cli import get_bagged_dag


def main(dag_id: str, logical_date: str, conf: str | None = None) -> int:
    dag = get_bagged_dag(bundle_names=None, dag_id=dag_id)
    when = datetime.fromisoformat(logical_date)
    run = dag.test(logical_date=when, run_after=when, run_conf=json.loads(conf) if conf else None)
    print(f"run {run.run_id}: {run.state}")
    return 0 if run.state == "success" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
