"""Connection parsing agrees with Airflow's own, so the job reads what the DAG handed over."""

from __future__ import annotations

import json

import pytest

from kafka_batch.connections import (
    ConnectionFields,
    from_environment,
    kafka_config,
    parse_connection,
    postgres_params,
    schema_registry_config,
)
from kafka_batch.errors import InputError


def test_json_and_uri_forms_match_airflow():
    from airflow.sdk import Connection

    uri = "postgres://user:p%40ss@db.example:5433/analytics?sslmode=require"
    ours = parse_connection("pg", uri)
    theirs = Connection.from_uri(uri, conn_id="pg")
    assert (ours.host, ours.port, ours.login, ours.password, ours.schema) == (
        theirs.host, theirs.port, theirs.login, theirs.password, theirs.schema,
    )
    assert postgres_params(ours) == {
        "host": "db.example", "port": 5433, "dbname": "analytics", "user": "user", "password": "p@ss", "sslmode": "require",
    }
    assert parse_connection("pg", ours.to_json()) == ours


def test_kafka_settings_come_from_the_extra():
    conn = parse_connection("k", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL"},
        "login": "alice", "password": "pw",
    }))
    assert kafka_config(conn) == {
        "bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL", "sasl.username": "alice", "sasl.password": "pw",
    }


def test_missing_connection_names_the_variable():
    with pytest.raises(InputError, match="AIRFLOW_CONN_KAFKA_X"):
        from_environment("kafka_x", environ={})


def test_password_is_not_in_repr():
    assert "pw" not in repr(ConnectionFields("x", password="pw", extra={"sasl.password": "pw"}))


def test_schema_registry_settings_from_a_connection():
    from kafka_batch.formats.registry import _url

    conn = parse_connection("sr", json.dumps({"conn_type": "http", "host": "registry", "port": 8081, "schema": "https",
                                              "login": "reader", "password": "s3cret",
                                              "extra": {"ssl.ca.location": "/ca.pem"}}))
    config = schema_registry_config(conn)
    assert config["url"] == "https://registry:8081" and config["basic.auth.user.info"] == "reader:s3cret"
    assert config["ssl.ca.location"] == "/ca.pem" and config["timeout"] == 10
    token = schema_registry_config(parse_connection("sr", "http://registry:8081?bearer.auth.token=t"))
    assert token["bearer.auth.credentials.source"] == "STATIC_TOKEN" and token["url"] == "http://registry:8081"
    with pytest.raises(InputError, match=r"unknown extra setting\(s\) \['sasl.username'\]"):
        schema_registry_config(parse_connection("sr", "http://registry:8081?sasl.username=x"))
    # Messages name the registry without the credentials a URL may carry.
    assert _url({"url": "https://user:s3cret@registry:8081"}) == "https://registry:8081"


@pytest.mark.parametrize("conn", [
    {"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15002},
    {"conn_type": "spark_connect", "host": "sc://spark.example", "port": 443, "login": "etl user",
     "password": "t0k/en;x", "extra": {"use_ssl": True}},
    {"conn_type": "spark_connect", "host": "spark.example", "extra": {"use_ssl": False}},
])
def test_a_spark_connect_url_is_the_providers(conn, monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from kafka_batch.spark.connect import connection_url

    monkeypatch.setenv("AIRFLOW_CONN_SC_TEST", json.dumps(conn))
    assert connection_url(from_environment("sc_test")) == SparkConnectHook("sc_test").get_connection_url()


class _Racing:
    """A session whose addArtifacts fails as Spark Connect's does when another client added the same file."""

    def __init__(self, message: str):
        self.message = message

    def addArtifacts(self, *paths, pyfile: bool) -> None:  # noqa: N802 - pyspark's name
        raise RuntimeError(self.message)


def test_a_package_another_client_added_at_the_same_moment_is_added(tmp_path):
    from kafka_batch.spark.connect import _add_package

    _add_package(_Racing("(java.nio.file.FileAlreadyExistsException) /tmp/artifacts-1/2/pyfiles/kafka_batch.zip"),
                 tmp_path / "kafka_batch.zip")
    with pytest.raises(RuntimeError, match="SESSION_CLOSED"):
        _add_package(_Racing("[INVALID_HANDLE.SESSION_CLOSED]"), tmp_path / "kafka_batch.zip")
