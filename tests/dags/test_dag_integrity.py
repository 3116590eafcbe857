"""Every DAG imports cleanly and follows the conventions; the compose file agrees with the pipelines."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from kafka_batch.airflow.operators import BatchSparkSubmitOperator
from kafka_batch.config import PROJECT_ROOT, load_pipelines
from kafka_batch.spark import submit
from kafka_batch_dev import kafka_broker

PIPELINES = load_pipelines(PROJECT_ROOT / "pipelines")


@pytest.fixture(scope="module")
def dagbag():
    """The DAGs of the repository's pipelines, whatever directory other tests' services point at."""
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KAFKA_BATCH_PIPELINES_DIR", str(PROJECT_ROOT / "pipelines"))
        return DagBag(dag_folder=str(PROJECT_ROOT / "dags"))


def test_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {d for p in PIPELINES.values() for d in (p.dag_id, f"{p.dag_id}__replay")}


@pytest.mark.parametrize("dag_id", sorted(d for p in PIPELINES.values() for d in (p.dag_id, f"{p.dag_id}__replay")))
def test_dag_conventions(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert dag.max_active_runs == 1
    assert "kafka_batch" in dag.tags and dag.doc_md
    assert not dag.catchup
    assert [t.task_id for t in dag.topological_sort()] == ["plan", "execute", "report"]
    for task in dag.tasks:
        assert task.retries >= 2, task.task_id
    # Nothing of a run waits forever: each task has its pipeline's bound (Timeouts).
    bounds = {t.task_id: t.execution_timeout.total_seconds() for t in dag.tasks}
    assert bounds == dag.get_task("execute").pipeline.task_timeouts()
    execute = dag.get_task("execute")
    assert isinstance(execute, BatchSparkSubmitOperator) and execute.pipeline.dag_id in dag_id
    # Connections go to the hook at run time, never to a rendered field.
    assert set(execute.template_fields) == {"batch_id", "plan_status", "mode"}


def test_a_pipelines_pool_bounds_its_execute_task_only():
    """`pool` puts the execute task (the one that holds Spark and Postgres) in that Airflow pool; plan and
    report stay in the default pool, so a full pool never stops a run from planning or reporting."""
    from kafka_batch.airflow.dag_factory import build_dag, build_replay_dag
    from kafka_batch.config import parse_pipeline

    raw = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    for pool, expected in ((None, "default_pool"), ("shared_spark", "shared_spark")):
        pipeline = parse_pipeline({**raw, "pool": pool})
        for dag in (build_dag(pipeline), build_replay_dag(pipeline)):
            assert {t.task_id: t.pool for t in dag.tasks} == {
                "plan": "default_pool", "execute": expected, "report": "default_pool"}


def test_params_forms_validate_their_input(dagbag):
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    batch = dagbag.dags[PIPELINES["page_views"].dag_id]
    assert batch.params["dry_run"] is False and batch.params["max_records_per_batch"] is None
    for bad in ({"max_records_per_batch": 0}, {"dry_run": "yes"}, {"max_records_per_partition": 1.5}):
        params = ParamsDict(batch.params)
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {next(iter(bad))}"):
            params.update(bad)
            params.validate()
    replay = dagbag.dags[f"{PIPELINES['page_views'].dag_id}__replay"]
    assert replay.params["dry_run"] is True  # a replay from the UI reports before it changes anything
    params = ParamsDict(replay.params)
    with pytest.raises(ParamValidationError, match="Invalid input for param topic"):
        params.update({"topic": "not_a_topic_of_the_pipeline"})
        params.validate()
    for bad in ({"partitions": ["x"]}, {"partitions": [-1]}, {"from_offset": "ten"}, {"reason": ""}):
        params = ParamsDict(replay.params)
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {next(iter(bad))}"):
            params.update(bad)
            params.validate()
    for good in ({"partitions": ["0", " 3 "]}, {"partitions": [0, 3]},  # the form's lines; the API's numbers
                 {"from_time": "2026-11-22T21:00:00Z", "until_time": "2026-11-22T22:00:00+00:00"}):
        params = ParamsDict(replay.params)
        params.update(good)
        params.validate()
    # A time the form's picker cannot give (Airflow checks no format): the plan task's first line refuses it.
    from kafka_batch.config import optional_time_ms
    from kafka_batch.errors import InputError

    with pytest.raises(InputError, match="from_time"):
        optional_time_ms("yesterday", "from_time")


def test_every_param_of_both_forms_is_described_with_an_example_in_the_widget_its_type_calls_for(dagbag):
    """What Airflow's trigger form draws from each param's schema (airflow-core's ui FieldSelector): an
    array whose items are not typed as non-strings is a list, one item per line (not a JSON editor); a
    string of format date-time a date-time picker; a number a number field; an enum a select."""
    for dag_id in (PIPELINES["page_views"].dag_id, f"{PIPELINES['page_views'].dag_id}__replay"):
        for name, param in dagbag.dags[dag_id].params.items():
            assert param.description, (dag_id, name)
            if param.schema.get("type") != "boolean" and name != "topic":
                assert "e.g." in param.description, (dag_id, name)
    replay = dagbag.dags[f"{PIPELINES['page_views'].dag_id}__replay"].params
    assert "type" not in replay.get_param("partitions").schema["items"]  # a list of lines
    assert all(replay.get_param(t).schema["format"] == "date-time" for t in ("from_time", "until_time"))
    assert "integer" in replay.get_param("from_offset").schema["type"]
    assert replay.get_param("topic").schema["enum"] == list(PIPELINES["page_views"].topics)


def test_a_backfill_of_a_pipeline_planned_by_offsets_is_refused_in_one_line_naming_the_replay_dag():
    from types import SimpleNamespace

    from kafka_batch.airflow.dag_factory import PLAN_BY_DOCS, _is_backfill, _refuse_offsets_backfill, build_dag
    from kafka_batch.config import parse_pipeline
    from kafka_batch.errors import InputError

    raw = PIPELINES["page_views"].definition
    by_offsets, by_time = parse_pipeline(raw), parse_pipeline({**raw, "plan_by": "time"})
    with pytest.raises(InputError, match=f"trigger {by_offsets.replay_dag_id} \\(offsets or times\\)"):
        _refuse_offsets_backfill(by_offsets, _is_backfill(SimpleNamespace(run_type="backfill")))
    for pipeline, run_type in ((by_offsets, "scheduled"), (by_offsets, "manual"), (by_time, "backfill")):
        _refuse_offsets_backfill(pipeline, _is_backfill(SimpleNamespace(run_type=run_type)))
    assert "**Plans by offsets.**" in build_dag(by_offsets).doc_md and "**Plans by time.**" in build_dag(by_time).doc_md
    assert PLAN_BY_DOCS.keys() == {"offsets", "time"}


def test_batch_id_reaches_spark_through_the_template(dagbag):
    dag = dagbag.dags[PIPELINES["page_views"].dag_id]
    execute = dag.get_task("execute")

    class TaskInstance:
        @staticmethod
        def xcom_pull(task_ids):
            return {"plan": {"batch_id": 42}}[task_ids]

    def render(template, **context):
        return dag.get_template_env().from_string(template).render(ti=TaskInstance, **context)

    assert (render(execute.batch_id), render(execute.mode)) == ("42", "commit")
    assert submit.application_args(execute.pipeline, 42, 3, "commit") == [
        "--batch-id", "42", "--postgres-conn", "kafka_batch_postgres", "--mode", "commit", "--try-number", "3"]
    replay = dagbag.dags[f"{PIPELINES['page_views'].dag_id}__replay"].get_task("execute")
    for dry_run, mode in ((True, "preview"), (False, "commit")):
        assert render(replay.mode, params={"dry_run": dry_run}) == mode


def test_parsing_reads_each_pipeline_file_once(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from kafka_batch import config

    base = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    for n in range(5):
        raw = {**base, "name": f"p{n}", "topics": [f"t{n}"],
               "sinks": {"aggregate": {**base["sinks"]["aggregate"], "table": f"t{n}"}}}
        (tmp_path / f"p{n}.yaml").write_text(yaml.safe_dump(raw))
    reads: list[str] = []
    real = config.load_pipeline_file
    monkeypatch.setattr(config, "load_pipeline_file", lambda path: reads.append(path.name) or real(path))
    monkeypatch.setenv("KAFKA_BATCH_PIPELINES_DIR", str(tmp_path))
    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {} and len(bag.dag_ids) == 10
    assert sorted(reads) == [f"p{n}.yaml" for n in range(5)]


def test_compose_defines_every_connection_and_service_the_pipelines_use():
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "postgres", "spark-master", "spark-worker", "airflow-apiserver", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer"} <= set(services)
    env = compose["x-airflow-common"]["environment"]
    for pipeline in PIPELINES.values():
        for conn_id in (pipeline.connections.kafka, pipeline.connections.postgres, pipeline.connections.spark):
            assert f"AIRFLOW_CONN_{conn_id.upper()}" in env, conn_id

    def conn(conn_id):
        return json.loads(env[f"AIRFLOW_CONN_{conn_id.upper()}"].replace("${KAFKA_BATCH_DB_PASSWORD}", "x"))

    kafka_host, kafka_port = conn("kafka_default")["extra"]["bootstrap.servers"].split(":")
    assert kafka_host in services
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_broker.KAFKA_VERSION}"  # the release `make up` runs
    assert f"INTERNAL://{kafka_host}:{kafka_port}" in services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert re.search(rf"INTERNAL://:{kafka_port}\b", services["kafka"]["environment"]["KAFKA_LISTENERS"])
    postgres = conn("kafka_batch_postgres")
    assert postgres["host"] in services and postgres["port"] == 5432
    spark = conn("spark_default")
    assert spark["host"] == "spark://spark-master" and "spark-master" in services
    assert f"spark://spark-master:{spark['port']}" in services["spark-worker"]["command"]
    connect = conn("spark_connect_default")  # the samples' execution: a Spark Connect server on that cluster
    assert connect["conn_type"] == "spark_connect" and connect["host"] in services
    assert f"spark.connect.grpc.binding.port={connect['port']}" in services[connect["host"]]["command"]
    assert "spark://spark-master:7077" in services[connect["host"]]["command"]
    assert services["airflow-scheduler"]["depends_on"][connect["host"]] == {"condition": "service_healthy"}
    assert "PYTHONPATH" not in str(services)  # dependencies are baked into the image


def test_the_compose_cluster_file_makes_three_replicated_nodes_every_client_knows():
    """docker-compose.cluster.yml over docker-compose.yml (Compose merges a service's environment key by
    key): three nodes, each a voter under its own id and reachable under its service's name, replication 3
    and min ISR 2, and the pipelines' connection naming every node."""
    base = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())["services"]
    over = yaml.safe_load((PROJECT_ROOT / "docker-compose.cluster.yml").read_text())["services"]
    services = {name: {**base.get(name, {}), **spec, "environment": {
        **base.get(name, {}).get("environment", {}), **spec.get("environment", {})}} for name, spec in over.items()}
    nodes = {name: s for name, s in services.items() if name.startswith("kafka")}
    assert len(nodes) == 3 and all(s["image"] == f"apache/kafka:{kafka_broker.KAFKA_VERSION}" for s in nodes.values())
    voters = {}
    for name, node in nodes.items():
        env = node["environment"]
        voters[env["KAFKA_NODE_ID"]] = name
        assert f"INTERNAL://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"], name
        assert (env["KAFKA_DEFAULT_REPLICATION_FACTOR"], env["KAFKA_MIN_INSYNC_REPLICAS"]) == (3, 2)
        assert (env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"], env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"],
                env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == (3, 3, 2)
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
    assert {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in (n["environment"] for n in nodes.values())} == {
        ",".join(f"{i}@{voters[i]}:9093" for i in sorted(voters))}
    airflow = [name for name in base if name.startswith("airflow-")]
    for name in airflow:
        kafka = json.loads(services[name]["environment"]["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]
        assert sorted(kafka["bootstrap.servers"].split(",")) == sorted(f"{n}:9092" for n in nodes), name


def test_compose_services_are_checked_healthy_and_share_one_jwt_secret():
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    one_shot = {name for name, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"airflow-init"}
    for name, service in services.items():
        assert name in one_shot or service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for needed, condition in service.get("depends_on", {}).items():
            wanted = "service_completed_successfully" if needed in one_shot else "service_healthy"
            assert condition == {"condition": wanted}, (name, needed, condition)
    for name in (n for n in services if n.startswith("airflow-")):  # from .env, the same for every component
        assert services[name]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] == "${AIRFLOW_JWT_SECRET}", name


def test_secrets_file_is_never_committed_and_the_example_names_every_variable():
    """Users copy .env.example to .env (the README says so): git must ignore it, and the example must
    give every variable the compose file interpolates."""
    import subprocess

    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=PROJECT_ROOT)
    assert ignored.returncode == 0, ".env is not git-ignored"
    tracked = subprocess.run(["git", "ls-files", ".env"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert tracked.stdout == ""
    example = {line.split("=", 1)[0] for line in (PROJECT_ROOT / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    used = set(re.findall(r"\$\{(\w+)", (PROJECT_ROOT / "docker-compose.yml").read_text()))
    assert used and used <= example, used - example


def test_a_broken_pipeline_file_costs_only_its_own_pipeline(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from kafka_batch.config import load_pipeline

    good = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "syntax.yaml").write_text("name: [unclosed\n")
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump({**good, "name": "other", "colour": "blue"}))
    monkeypatch.setenv("KAFKA_BATCH_PIPELINES_DIR", str(tmp_path))
    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"kafka_batch__page_views", "kafka_batch__page_views__replay",
                                "kafka_batch__invalid__syntax", "kafka_batch__invalid__unknown"}
    assert "not valid YAML" in bag.dags["kafka_batch__invalid__syntax"].description
    assert "unknown key(s) ['colour']" in bag.dags["kafka_batch__invalid__unknown"].description
    assert load_pipeline("page_views", tmp_path).name == "page_views"  # the CLI still runs the healthy one
    with pytest.raises(Exception, match=r"^pipeline 'other' \(.*unknown.yaml\): unknown key\(s\) \['colour'\]"):
        load_pipeline("other", tmp_path)  # its own file's error, as it is
    with pytest.raises(Exception, match=r"(?s)unknown pipeline .nope.*invalid file .*unknown.yaml"):
        load_pipeline("nope", tmp_path)


def test_parsing_json_pipelines_imports_no_data_library(tmp_path):
    """Every Airflow task parses the DAG file before it runs (Airflow 3): plan, execute and report need
    neither Arrow nor pandas nor a binary format's library, so loading JSON pipelines imports none of
    them (pyarrow and numpy alone cost a task 0.15 s). Avro and Protobuf definitions need pyarrow to be
    checked."""
    import subprocess
    import sys

    for name in ("page_views.yaml", "page_view_log.yaml", "customers.yaml"):
        (tmp_path / name).write_text((PROJECT_ROOT / "pipelines" / name).read_text())
    heavy = ("pyarrow", "numpy", "pandas", "pyspark", "fastavro", "google.protobuf", "pgpq")
    probe = (f"import runpy, sys; runpy.run_path({str(PROJECT_ROOT / 'dags' / 'kafka_batch_pipelines.py')!r});"
             "import kafka_batch.core.planning, kafka_batch.core.report;"
             f"print([m for m in {heavy!r} if m in sys.modules])")
    env = {**os.environ, "KAFKA_BATCH_PIPELINES_DIR": str(tmp_path)}
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert found.stdout.strip().splitlines()[-1] == "[]"
