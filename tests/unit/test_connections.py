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
