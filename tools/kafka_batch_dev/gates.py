"""Gates that hold a pipeline's Postgres transaction at a chosen moment, so that a fault lands in that
moment for sure: the fault-injection suite (`make chaos`) and the failover tests use them.

A `LockGate` holds a SHARE lock on one table: a session that writes the table waits there, inside its
transaction. `commit_gate` makes the pipeline's Postgres COMMIT itself wait at one (a deferred trigger
fires at COMMIT, so after everything the commit transaction does, the Kafka sink's publish included):
the moment between the Kafka and the Postgres commit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import psycopg2


class LockGate:
    """A SHARE lock on `table`, held until `open`; `application_name`: whose sessions it watches (any)."""

    def __init__(self, params: Mapping[str, Any], table: str, application_name: str | None = None):
        self.params = dict(params)
        self.table = table
        self.application_name = application_name
        self.conn = psycopg2.connect(**self.params)
        with self.conn.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN SHARE MODE")

    def _sql(self, statement: str) -> list[tuple]:
        conn = psycopg2.connect(**self.params)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement + " AND (%s::text IS NULL OR a.application_name = %s)",
                            (self.table, self.application_name, self.application_name))
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def waiting(self) -> set[int]:
        """Client ports of the sessions waiting at the gate (which find the process that opened each)."""
        return {port for (port,) in self._sql(
            "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted"
            " AND l.relation = %s::regclass")}

    def wait_for_a_session(self, timeout: float = 120.0, alive=lambda: True) -> bool:
        """Whether a session came to wait at the gate within `timeout` (while `alive()`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive():
            if self.waiting():
                return True
            time.sleep(0.02)
        return False

    def terminate_waiting(self, timeout: float = 30.0) -> None:
        """End the sessions waiting at the gate (their transactions abort), and wait until they are gone."""
        self._sql("SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                  " WHERE NOT l.granted AND l.relation = %s::regclass")
        deadline = time.monotonic() + timeout
        while self.waiting():
            if time.monotonic() > deadline:
                raise RuntimeError(f"sessions still wait at {self.table} after being terminated")
            time.sleep(0.05)

    def open(self) -> None:
        self.conn.rollback()
        self.conn.close()


# A deferred trigger: when the pipeline's batch becomes committed, its transaction's COMMIT inserts into
# the gate's table, and so waits for the gate.
_COMMIT_GATE = """
CREATE TABLE IF NOT EXISTS public.{gate} (at timestamptz DEFAULT now());
CREATE OR REPLACE FUNCTION public.{gate}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
  IF NEW.pipeline = '{pipeline}' AND NEW.status = 'committed' THEN
    INSERT INTO public.{gate} DEFAULT VALUES;
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER {gate} AFTER UPDATE ON kafka_batch.batches DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION public.{gate}();
"""


def commit_gate(params: Mapping[str, Any], pipeline: str, application_name: str | None = None) -> LockGate:
    """A gate where the pipeline's Postgres COMMIT of a batch waits: after its Kafka sink published."""
    gate = f"{pipeline}_gate"
    conn = psycopg2.connect(**params)
    with conn, conn.cursor() as cur:
        cur.execute(_COMMIT_GATE.format(gate=gate, pipeline=pipeline))
    conn.close()
    return LockGate(params, f"public.{gate}", application_name)
