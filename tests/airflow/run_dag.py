"""One DAG run through Airflow with a stable run id:
`python -m tests.airflow.run_dag DAG_ID LOGICAL_DATE [CONF [RUN_AFTER]]`.

Like `airflow dags test`, but the run id comes from RUN_AFTER (default: the logical date), so running
it again with the same dates re-runs the same run (same run id), as clearing a run in the UI does;
another RUN_AFTER gives a new run over the same data interval, as a backfill does.

`python -m tests.airflow.run_dag --serve` runs many DAG runs, one after another, in one process
(helpers.run_dag): importing Airflow and building its in-process execution API (Cadwyn's versioned
routes) cost about 13 s of CPU, paid once instead of once per run. Each request is a JSON line on stdin,
`{"args": [...], "env": {...}, "output": path}`; the run's output (file descriptors 1 and 2, so Spark's
too) goes to `output`, and the reply `{"returncode": N}` is one line on the original stdout.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import datetime


def main(dag_id: str, logical_date: str, conf: str | None = None, run_after: str | None = None) -> int:
    from airflow.utils.cli import get_bagged_dag

    dag = get_bagged_dag(bundle_names=None, dag_id=dag_id)
    when = datetime.fromisoformat(logical_date)
    after = datetime.fromisoformat(run_after) if run_after else when
    run = dag.test(logical_date=when, run_after=after, run_conf=json.loads(conf) if conf else None)
    print(f"run {run.run_id}: {run.state}")
    return 0 if run.state == "success" else 1


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        request = json.loads(line)
        os.environ.clear()
        os.environ.update(request["env"])
        with open(request["output"], "ab") as output:
            saved = os.dup(1), os.dup(2)
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
            try:
                code = main(*request["args"])
            except (Exception, SystemExit):  # a run that cannot start is that run's failure, not the server's
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                for fd, original in zip((1, 2), saved, strict=True):
                    os.dup2(original, fd)
                    os.close(original)
        replies.write(json.dumps({"returncode": code}) + "\n")
        replies.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        sys.exit(main(*sys.argv[1:]))
