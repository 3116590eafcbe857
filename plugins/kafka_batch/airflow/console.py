"""The console: a read-only page and its JSON endpoints, served by Airflow's api-server (FastAPI).

Mounted by the plugin (`kafka_batch.airflow.plugin`) under `/kafka-batch/` and shown in the
Airflow UI's navigation. Every endpoint needs a user authenticated by Airflow's own auth manager
(plugin endpoints are not protected by default), and shows a user only the pipelines whose DAG that
auth manager lets them read: the overview leaves the others out, their endpoints answer 403. Each
pipeline is asked with its own connections, resolved through Airflow; a pipeline whose Postgres or
Kafka does not answer gets its own error and the page still loads. Responses never hold a connection
detail: messages are scrubbed of the connections' hosts, logins and secrets. The queries are
`kafka_batch.core.inspection`'s (read-only); Airflow's own database says which pools exist.
"""

from __future__ import annotations

import logging
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"console.js": "text/javascript", "console.css": "text/css"}
KAFKA_TIMEOUT_SECONDS = 5.0
POSTGRES_CONNECT_TIMEOUT_SECONDS = 5
MAX_LIMIT = 500


# --- no connection detail in any response ------------------------------------------------------------

_HOST_PORT = re.compile(r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|localhost)(?::\d{2,5})?\b")
_SECRET_KEYS = ("password", "secret", "servers", "username", "token", "key", "host", "url")


def _sensitive_values(conns) -> list[str]:
    values: set[str] = set()
    for conn in conns:
        values.update(str(v) for v in (conn.host, conn.login, conn.password, conn.schema) if v)
        for key, value in conn.extra.items():
            if isinstance(value, str) and any(word in key.lower() for word in _SECRET_KEYS):
                values.add(value)
                values.update(part.strip() for part in value.split(",") if part.strip())
    return sorted((v for v in values if len(v) >= 3), key=len, reverse=True)


def scrub(text: str | None, conns=()) -> str | None:
    """A message as the page may show it: the connections' values and any host:port replaced."""
    if text is None:
        return None
    for value in _sensitive_values(conns):
        text = text.replace(value, "<hidden>")
    return _HOST_PORT.sub(lambda m: m.group(0) if _looks_like_a_word(m.group(0)) else "<hidden>", text)


def _looks_like_a_word(found: str) -> bool:
    """Dotted names that are not addresses (kafka_batch.batches, file.py) stay readable."""
    if ":" in found or re.fullmatch(r"\d{1,3}(?:\.\d{1,3}){3}", found) or found == "localhost":
        return False
    return not re.search(r"\.(?:com|net|org|io|internal|local|lan|svc|cluster)$", found)


def _error(exc: BaseException, conns=()) -> str:
    from kafka_batch.errors import KafkaBatchError

    kind = "error" if isinstance(exc, KafkaBatchError) else type(exc).__name__
    return f"{kind}: {scrub(' '.join(str(exc).split()) or type(exc).__name__, conns)}"


# --- one pipeline's services, through Airflow's connections ----------------------------------------------

class _Services:
    """A pipeline's Postgres session and Kafka clients, opened with its own Airflow connections."""

    def __init__(self, pipeline, conns: list) -> None:
        from kafka_batch import connections
        from kafka_batch.core import database
        from kafka_batch.kafka.source import KafkaOffsets

        self.conns = conns  # what was resolved so far, for scrubbing an error raised further on
        postgres = connections.from_airflow(pipeline.connections.postgres)
        conns.append(postgres)
        kafka = connections.from_airflow(pipeline.connections.kafka)
        conns.append(kafka)
        self.kafka_config = connections.kafka_config(kafka)
        params = connections.postgres_params(postgres)
        params.setdefault("connect_timeout", POSTGRES_CONNECT_TIMEOUT_SECONDS)
        params.setdefault("application_name", "kafka-batch-console")
        self.conn = database.connect(params)
        self._kafka_offsets = None
        self._KafkaOffsets = KafkaOffsets

    @property
    def kafka(self):
        if self._kafka_offsets is None:
            self._kafka_offsets = self._KafkaOffsets(self.kafka_config, timeout=KAFKA_TIMEOUT_SECONDS)
        return self._kafka_offsets

    def close(self) -> None:
        self.conn.close()


def _describe(pipeline) -> dict:
    return {
        "name": pipeline.name, "dag_id": pipeline.dag_id, "replay_dag_id": pipeline.replay_dag_id,
        "topics": pipeline.topics_label, "tables": list(pipeline.tables), "schedule": pipeline.schedule,
        "plan_by": pipeline.plan_by, "on_data_loss": pipeline.on_data_loss,
    }


def _pool_errors(pipelines) -> dict[str, str]:
    """Per pipeline whose `pool` Airflow does not have, what is wrong: the scheduler leaves such a task
    scheduled and never runs it, saying so only in its own log (Airflow 3's DAG processor does not
    check pools), so the pipeline would fall behind with nothing failed."""
    named = {p.name: p.pool for p in pipelines if p.pool}
    if not named:
        return {}
    from airflow.models.pool import Pool

    existing = {pool.pool for pool in Pool.get_pools()}
    return {name: f"pool {pool!r} does not exist in Airflow: the execute task waits, scheduled, and never runs;"
                  f" create it (airflow pools set {shlex.quote(pool)} SLOTS DESCRIPTION) or change the definition's pool"
            for name, pool in named.items() if pool not in existing}


def _opened(pipeline, conns: list) -> _Services:
    """Services for the pipeline; on failure, an error already scrubbed of what was resolved."""
    try:
        return _Services(pipeline, conns)
    except Exception as exc:
        log.warning("console: pipeline %s: %s", pipeline.name, exc)
        raise _PipelineError(_error(exc, conns)) from None


class _PipelineError(Exception):
    """A per-pipeline failure, its message fit for the page."""


def _overview_of(pipelines: list) -> list[dict]:
    """The overview's rows of pipelines that share their Postgres and Kafka connections: one session and
    one Kafka client for them all (inspection.overview)."""
    from kafka_batch.core import inspection

    rows = {p.name: {**_describe(p), "error": None, "kafka_error": None, "not_started": None, "lag": None,
                     "oldest_unread_at": None,
                     "partitions": None, "partitions_behind": None,
                     "alerts": p.alerts.model_dump(exclude_none=True), "behind": []} for p in pipelines}
    conns: list = []
    try:
        services = _opened(pipelines[0], conns)
    except _PipelineError as exc:
        return [{**row, "error": str(exc)} for row in rows.values()]
    try:
        inspection.check_schema(services.conn)
        for line in inspection.overview(services.conn, services.kafka, services.kafka_config, pipelines,
                                        timeout=KAFKA_TIMEOUT_SECONDS):
            row = rows[line.pop("pipeline").name]
            failed = {key: line.pop(key) for key in ("error", "kafka_error")}
            row.update(line)
            for key, exc in failed.items():
                if exc is not None:
                    log.warning("console: pipeline %s: %s", row["name"], exc)
                    row[key] = _error(exc, conns)
    except Exception as exc:
        log.warning("console: pipelines %s: %s", ", ".join(rows), exc)
        for row in rows.values():
            row["error"] = _error(exc, conns)
    finally:
        services.close()
    return list(rows.values())


def _commands(pipeline, topic: str, partition: int, from_offset: int, until_offset: int) -> dict:
    """What an operator runs to recompute or rewind a range: the CLI line, or the replay DAG's params."""
    name, q = pipeline.name, shlex.quote
    return {
        "replay_cli": f"kafka-batch replay --pipeline {q(name)} --topic {q(topic)} --partitions {partition}"
                      f" --from {from_offset} --until {until_offset} --reason 'why' --dry-run",
        "rewind_cli": f"kafka-batch reset --pipeline {q(name)} --topic {q(topic)} --partitions {partition}"
                      f" --to-offset {from_offset} --reason 'why'",
        "replay_params": {"topic": topic, "partitions": [partition], "from_offset": from_offset,
                          "until_offset": until_offset, "reason": "why", "dry_run": True},
    }


def _detail(pipeline, limit: int) -> dict:
    from kafka_batch.core import inspection, report

    conns: list = []
    services = _opened(pipeline, conns)
    try:
        inspection.check_schema(services.conn)
        result: dict[str, Any] = {"pipeline": _describe(pipeline), "kafka_error": None, "topics": [], "partitions": []}
        try:
            result["partitions"] = inspection.partitions(services.conn, services.kafka, services.kafka_config, pipeline,
                                                         timeout=KAFKA_TIMEOUT_SECONDS)
            result["topics"] = [asdict(t) for t in report.topic_totals(
                (p["topic"], p["partition"], p["lag"], p["last_batch_id"]) for p in result["partitions"])]
        except Exception as exc:
            log.warning("console: pipeline %s: Kafka: %s", pipeline.name, exc)
            result["kafka_error"] = _error(exc, conns)
        result["kafka_sinks"] = _kafka_sinks(pipeline, services, result, conns)
        rows = inspection.batches(services.conn, pipeline.name, limit)
        for row in rows:
            row["error"] = scrub(row["error"], conns) if row["status"] in ("failed", "superseded") else None
        result["batches"] = rows
        result["history"] = inspection.history(services.conn, pipeline.name, MAX_LIMIT)
        result["data_loss"] = inspection.data_loss(services.conn, pipeline.name, limit)
        result["resets"] = inspection.resets(services.conn, pipeline.name, limit)
        result["replay_previews"] = inspection.replay_previews(services.conn, pipeline.name, limit)
        return result
    finally:
        services.close()


def _kafka_sinks(pipeline, services: _Services, result: dict, conns: list) -> list[dict]:
    """Each Kafka sink's last published batch and open transactions (kafka_publish.sink_states); a broker
    that does not answer is the page's Kafka error, once."""
    if not pipeline.publishing_sinks or result["kafka_error"]:
        return []
    from kafka_batch.kafka.publish import sink_states

    inputs = [(p["topic"], p["partition"]) for p in result["partitions"]]
    try:
        config = services.kafka_config
        if pipeline.connections.kafka_output:  # the sink publishes on a cluster of its own
            from kafka_batch import connections

            output = connections.from_airflow(pipeline.connections.kafka_output)
            conns.append(output)
            config = connections.kafka_config(output)
        return sink_states(config, pipeline, inputs, timeout=KAFKA_TIMEOUT_SECONDS)
    except Exception as exc:
        log.warning("console: pipeline %s: Kafka sink: %s", pipeline.name, exc)
        result["kafka_error"] = _error(exc, conns)
        return []


def _ledger(pipeline, topic: str, partition: int, limit: int) -> list[dict]:
    from kafka_batch.core import inspection

    services = _opened(pipeline, [])
    try:
        inspection.check_schema(services.conn)
        rows = inspection.ledger(services.conn, pipeline.name, topic, partition, limit)
    finally:
        services.close()
    for row in rows:
        row.update(_commands(pipeline, topic, partition, row["from_offset"], row["until_offset"]))
    return rows


# --- the app -----------------------------------------------------------------------------------------------

def create_app():
    """The FastAPI app; every route depends on an authenticated Airflow user."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import get_user, requires_authenticated
    from fastapi import Depends, FastAPI, HTTPException, Query
    from fastapi.responses import FileResponse, HTMLResponse

    from kafka_batch.config import invalid_dag_id, load_pipelines
    from kafka_batch.core.inspection import sharing_connections

    app = FastAPI(title="kafka-batch console", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(requires_authenticated())])

    # The user, as a default rather than an annotation (this module's annotations are strings FastAPI
    # would resolve in the module's globals).
    the_user = Depends(get_user)

    def readable(user, dag_ids: set[str]) -> set[str]:
        """The DAGs Airflow's auth manager lets this user read (per DAG, as Airflow's own DAG list)."""
        return get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET")

    def pipelines(user) -> tuple[dict, dict]:
        """The pipelines and invalid files whose DAGs the user may read."""
        invalid: dict[str, str] = {}
        found = load_pipelines(invalid=invalid)
        allowed = readable(user, {p.dag_id for p in found.values()} | {invalid_dag_id(f) for f in invalid})
        return ({name: p for name, p in found.items() if p.dag_id in allowed},
                {f: e for f, e in invalid.items() if invalid_dag_id(f) in allowed})

    def one(name: str, user):
        found = load_pipelines(invalid={})
        if name not in found:
            raise HTTPException(status_code=404, detail=f"no pipeline named {name!r}")
        if not readable(user, {found[name].dag_id}):
            raise HTTPException(status_code=403, detail=f"you may not read DAG {found[name].dag_id}")
        return found[name]

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "console.html").read_text())

    @app.get("/static/{name}")
    def static(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise HTTPException(status_code=404)
        return FileResponse(STATIC / name, media_type=STATIC_FILES[name])

    @app.get("/api/overview")
    def overview(user=the_user) -> dict:
        found, invalid = pipelines(user)
        with ThreadPoolExecutor(max_workers=4) as pool:
            by_name = {row["name"]: row for rows in pool.map(_overview_of, sharing_connections(found.values()))
                       for row in rows}
        pool_errors = _pool_errors(found.values())
        return {"pipelines": [{**by_name[name], "pool_error": pool_errors.get(name)} for name in found],
                "invalid_files": [{"file": Path(f).name, "error": scrub(e)} for f, e in invalid.items()]}

    @app.get("/api/pipelines/{name}")
    def detail(name: str, user=the_user, limit: int = Query(20, ge=1, le=MAX_LIMIT)) -> dict:
        pipeline = one(name, user)
        pool_error = _pool_errors([pipeline]).get(name)
        try:
            return {**_detail(pipeline, limit), "pool_error": pool_error}
        except _PipelineError as exc:
            return {"pipeline": _describe(pipeline), "error": str(exc), "pool_error": pool_error}

    @app.get("/api/pipelines/{name}/ledger")
    def ledger(name: str, topic: str, user=the_user, partition: int = Query(..., ge=0),
               limit: int = Query(100, ge=1, le=MAX_LIMIT)) -> dict:
        pipeline = one(name, user)
        try:
            return {"topic": topic, "partition": partition, "ranges": _ledger(pipeline, topic, partition, limit)}
        except _PipelineError as exc:
            return {"topic": topic, "partition": partition, "error": str(exc), "ranges": []}

    return app


class LazyConsole:
    """An ASGI app that builds the console on its first request.

    Airflow imports plugins in every component (scheduler, dag-processor, workers); this keeps that
    import free of FastAPI routes and of the api-server's security module.
    """

    def __init__(self) -> None:
        self._app = None

    async def __call__(self, scope, receive, send) -> None:
        if self._app is None:
            self._app = create_app()
        await self._app(scope, receive, send)
