"""One DAG run through Airflow with a stable run id:
`python -m tests.integration.run_dag DAG_ID LOGICAL_DATE [CONF [RUN_AFTER]]`.

Like `airflow dags test`, but the run id comes from RUN_AFTER (default: the logical date), so running
it again with the same dates re-runs the same run (same run id), as clearing a run in the UI does;
another RUN_AFTER gives a new run over the same data interval, as a backfill does.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

from airflow.utils.cli import get_bagged_dag


def main(dag_id: str, logical_date: str, conf: str | None = None, run_after: str | None = None) -> int:
    dag = get_bagged_dag(bundle_names=None, dag_id=dag_id)
    when = datetime.fromisoformat(logical_date)
    after = datetime.fromisoformat(run_after) if run_after else when
    run = dag.test(logical_date=when, run_after=after, run_conf=json.loads(conf) if conf else None)
    print(f"run {run.run_id}: {run.state}")
    return 0 if run.state == "success" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
