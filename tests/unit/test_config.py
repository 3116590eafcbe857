"""Pipeline definitions: the shipped ones load, and every kind of mistake is named."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from kafka_batch.config import PROJECT_ROOT, load_pipelines, parse_pipeline
from kafka_batch.errors import InputError

BASE = yaml.safe_load((PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text())


def with_changes(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def test_shipped_pipelines_load():
    pipelines = load_pipelines(PROJECT_ROOT / "pipelines")
    page_views = pipelines["page_views"]
    assert page_views.topics == ("page_views",)
    [aggregate] = page_views.sinks
    assert [c.name for c in aggregate.group_by] == ["page", "minute"]
    assert page_views.dag_id == "kafka_batch__page_views"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "Bad-Name"}, "name: 'Bad-Name' must be a lower-case SQL identifier"),
        ({"topics": []}, "topics: Value should have at least 1 item"),
        ({"start": "middle"}, "start: must be 'earliest', 'latest', {timestamp: <ISO 8601>} or {offsets"),
        ({"start": {"timestamp": "2026-01-01T00:00:00"}}, "start.timestamp: '2026-01-01T00:00:00' needs a time zone"),
        ({"start": {"timestamp": "yesterday"}}, "start.timestamp: 'yesterday' is not an ISO 8601 date-time"),
        ({"start": {"offsets": {"page_views": {0: -1}}}}, "start.offsets.page_views.0: Input should be greater than or equal to 0 (got -1)"),
        ({"start": {"offsets": {"other": {0: 5}}}}, "start.offsets names topic(s) ['other'] that are not in topics"),
        ({"topics": {"pattern": "page_(views"}}, "topics.pattern: 'page_(views' is not a valid regular expression"),
        ({"topics": {"regex": "x"}}, "topics: unknown key(s) ['regex']; known: ['pattern']"),
        ({"topics": ["a", "a"]}, "name a topic twice"),
        ({"new_partitions": "never"}, "new_partitions: Input should be 'earliest' or 'latest' (got 'never')"),
        ({"on_data_loss": "ignore"}, "on_data_loss: Input should be 'fail' or 'skip' (got 'ignore')"),
        ({"limits": {"max_records_per_task": 0}}, "limits.max_records_per_task: Input should be greater than 0 (got 0)"),
        ({"limits": {"max_records": 5}}, "limits: unknown key(s) ['max_records']; known: ['max_invalid_ratio',"),
        ({"record": {"fields": {"page": "varchar"}}}, "record.fields.page: Input should be 'string', 'long', 'int', 'double', 'boolean' or 'timestamp' (got 'varchar')"),
        ({"record": {"fields": {"offset": "long"}}}, "clashes with the record column"),
        ({"colour": "blue"}, "unknown key(s) ['colour']; known: ['alerts', 'connections', 'description',"),
        ({"connections": {"redis": "x"}},
         "connections: unknown key(s) ['redis']; known: ['kafka', 'kafka_output', 'postgres', 'schema_registry', 'spark']"),
        ({"sinks": {}}, "sinks must name one or more of ['aggregate', 'kafka', 'rows', 'upsert']"),
        ({"sinks": {"parquet": {}}}, "sinks: unknown key(s) ['parquet']; known: ['aggregate', 'kafka', 'rows', 'upsert']"),
        ({"sinks": {"rows": {"table": "t", "columns": {"kafka_offset": "offset"}}}}, "reserved for the record's key"),
        ({"sinks": {"rows": {"table": "t", "columns": {"page": {"expr": "page", "typ": "text"}}}}}, "sinks.rows.columns.page: unknown key(s) ['typ']; known: ['expr', 'type']"),
        ({"aggregation": {}}, "'aggregation' moved under 'sinks'"),
        ({"sinks": {"upsert": {"table": "t", "key": {"page": "page"}, "columns": {"row_version": "page"}}}},
         "sinks.upsert: column name(s) ['row_version'] are reserved"),
        ({"sinks": {"upsert": {"table": "t", "key": {"page": "page"}, "columns": {"page": "page"}}}},
         "sinks.upsert: column(s) ['page'] defined twice (in key and columns)"),
        ({"sinks": {"upsert": {"table": "t", "key": {"page": "page"}, "version": {"expr": "x", "type": "boolean"}}}},
         "sinks.upsert.version.type: Input should be 'bigint', 'integer', 'double precision', 'timestamptz', 'date' or"),
        ({"sinks": {"upsert": {"table": "t", "key": {}}}}, "sinks.upsert.key: Dictionary should have at least 1 item"),
        ({"record": {"envelope": "debezium", "fields": {"op": "string"}}},
         "record: field name(s) ['op'] clash with the debezium envelope's columns"),
        ({"record": {"envelope": "canal", "fields": {"page": "string"}}}, "record.envelope: Input should be 'debezium'"),
        # Identifiers from configuration reach SQL only once validated (and quoted).
        ({"sinks": {"aggregate": {"table": "x; DROP TABLE kafka_batch.offsets", "group_by": {}, "measures": {}}}},
         "sinks.aggregate.table: 'x; DROP TABLE kafka_batch.offsets' must be a lower-case SQL identifier"),
        ({"sinks": {"rows": {"table": "t", "columns": {'p"age': "page"}}}}, "must be a lower-case SQL identifier"),
        ({"record": {"fields": {'user"; drop': "string"}}}, "record.fields.user\"; drop (as a name): 'user\"; drop' is not a plain field name"),
    ],
)
def test_invalid_definitions_are_named(changes, message):
    with pytest.raises(InputError) as excinfo:
        parse_pipeline(with_changes(**changes), source="test.yaml")
    assert message in str(excinfo.value)
    assert "test.yaml" in str(excinfo.value)


def test_start_policies_and_topic_patterns_parse():
    by_time = parse_pipeline(with_changes(start={"timestamp": "2026-03-01T10:00:00+01:00"}))
    assert (by_time.start.kind, by_time.start.timestamp_ms) == ("timestamp", 1772355600000)
    by_offsets = parse_pipeline(with_changes(start={"offsets": {"page_views": {0: 10, "1": 20}}}))
    assert by_offsets.start.offsets == {("page_views", 0): 10, ("page_views", 1): 20}
    by_pattern = parse_pipeline(with_changes(topics={"pattern": r"page_views\..+"}))
    assert (by_pattern.topics, by_pattern.topic_pattern) == ((), r"page_views\..+")
    assert "matching" in by_pattern.topics_label


def test_measures_must_have_an_additive_type():
    raw = with_changes()
    raw["sinks"]["aggregate"]["measures"]["views"]["type"] = "text"
    with pytest.raises(InputError, match=r"sinks.aggregate.measures.views.type: Input should be 'bigint' or 'double precision' \(got 'text'\)"):
        parse_pipeline(raw)


def test_two_pipelines_cannot_share_a_table(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(with_changes(name="a")))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(with_changes(name="b")))
    with pytest.raises(InputError, match="pipelines 'a' and 'b' both write table 'page_view_minutes'"):
        load_pipelines(tmp_path)


def test_a_file_gone_between_listing_and_reading_defines_nothing(tmp_path):
    # A link to nothing is listed like a file removed right after the listing (an editor's save, a deploy).
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(with_changes(name="a")))
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    invalid: dict = {}
    assert list(load_pipelines(tmp_path, invalid)) == ["a"] and invalid == {}
    assert list(load_pipelines(tmp_path)) == ["a"]


def test_pipeline_files_read_as_pyyaml_s_own_safe_loader_reads_them(tmp_path):
    """The files are read with libyaml's loader (config.YAML_LOADER, for speed): every shipped pipeline, and
    YAML's corners (a date, a multi-line string, non-ASCII text, a number that is a string),
    give what the pure-Python safe loader gives; bad YAML is one error naming the file."""
    from kafka_batch.config import YAML_LOADER, load_pipeline_file

    assert YAML_LOADER is yaml.CSafeLoader  # PyYAML's wheel has libyaml: else this test shows nothing
    corners = """
name: corners
description: |
  Vues par page — über die Minute
  second line
topics: [page_views]
start: {timestamp: 2026-03-01T10:00:00+01:00}
record: {format: json, fields: {user_id: string, page: string, duration_ms: long}}
sinks:
  aggregate:
    table: corners
    group_by:
      page: {expr: page, type: text}
      code: {expr: "'007'", type: text}
    measures:
      views: {expr: "1", type: bigint}
"""
    texts = [path.read_text() for path in sorted((PROJECT_ROOT / "pipelines").glob("*.yaml"))] + [corners]
    for text in texts:
        assert yaml.load(text, Loader=YAML_LOADER) == yaml.safe_load(text)
    (tmp_path / "corners.yaml").write_text(corners)
    assert load_pipeline_file(tmp_path / "corners.yaml").description.startswith("Vues par page — über")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(InputError, match=r"pipeline file .*bad.yaml: not valid YAML"):
        load_pipeline_file(tmp_path / "bad.yaml")


def test_a_definition_round_trips_through_its_snapshot():
    import json

    from kafka_batch.config import from_snapshot

    pipeline = parse_pipeline(with_changes(start={"timestamp": "2026-03-01T10:00:00+01:00"}), source="a.yaml")
    again = from_snapshot(json.loads(pipeline.snapshot()), source="batch 1")
    assert again == pipeline and again.definition_hash == pipeline.definition_hash
    changed = pipeline.with_limits(max_records_per_batch=7)
    assert changed.limits.max_records_per_batch == 7 and changed.definition_hash != pipeline.definition_hash


def test_a_pipeline_may_have_both_sinks_but_not_one_table_twice():
    both = with_changes(sinks={**BASE["sinks"], "rows": {"table": "page_views_raw", "columns": {"page": "page"}}})
    assert [s.kind for s in parse_pipeline(both).sinks] == ["aggregate", "rows"]
    clash = with_changes(sinks={**BASE["sinks"], "rows": {"table": "page_view_minutes", "columns": {"page": "page"}}})
    with pytest.raises(InputError, match="two sinks write the same table"):
        parse_pipeline(clash)


@pytest.mark.parametrize(
    "kafka, message",
    [
        ({"topic": "out", "changelog_of": "elsewhere"},
         "changelog_of names table 'elsewhere', which no aggregate or upsert sink of the pipeline writes"
         " (keyed tables: ['page_view_minutes'])"),
        ({"topic": "out", "changelog_of": "views"}, "changelog_of names table 'views', which no"),  # rows: no key
        ({"topic": "out", "changelog_of": "page_view_minutes", "transaction_timeout_seconds": 120},
         "sinks.kafka.transaction_timeout_seconds 120 is shorter than a batch's publish can take (290 s:"
         " limits.max_records_per_batch 10000000 messages at 50,000 a second, and three read.kafka_timeout_seconds"
         " 30)"),
        ({"topic": "out", "changelog_of": "page_view_minutes", "value": {"page": "page"}},
         "give either value (one message per record) or changelog_of (a table's changes)"),
        ({"topic": "out"}, "give either value (one message per record) or changelog_of"),
        ({"topic": "out", "changelog_of": "page_view_minutes", "key": "page"}, "leave key out"),
        (None, "connections.kafka_output names the cluster a Kafka sink publishes to, and the pipeline has no Kafka"
               " sink"),
    ],
)
def test_a_kafka_sink_has_one_shape_and_a_changelog_names_a_keyed_table(kafka, message):
    raw = with_changes()
    raw["sinks"]["rows"] = {"table": "views", "columns": {"page": "page"}}
    if kafka is None:
        raw["connections"] = {"kafka_output": "kafka_elsewhere"}
    else:
        raw["sinks"]["kafka"] = kafka
    with pytest.raises(InputError, match=re.escape(message)):
        parse_pipeline(raw)
    raw["sinks"]["kafka"] = {"topic": "out", "changelog_of": "page_view_minutes"}
    assert parse_pipeline(raw).sink_settings.kafka.publishes_tables == ("page_view_minutes",)
    assert parse_pipeline(raw).connections.publish == raw.get("connections", {}).get("kafka_output", "kafka_default")


def test_pipelines_are_read_from_the_setting_else_the_checkout_else_beside_airflows_dags(monkeypatch, tmp_path):
    from kafka_batch import config

    monkeypatch.setenv("KAFKA_BATCH_PIPELINES_DIR", str(tmp_path / "mine"))
    assert config.pipelines_dir() == tmp_path / "mine"
    monkeypatch.delenv("KAFKA_BATCH_PIPELINES_DIR")
    assert config.pipelines_dir() == config.PROJECT_ROOT / "pipelines"  # run from a checkout
    monkeypatch.setattr(config, "PROJECT_ROOT", tmp_path / "lib")  # installed: site-packages' parent, no pyproject.toml
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    assert config.pipelines_dir() == tmp_path / "airflow" / "pipelines"
