"""Pipeline definitions: the shipped ones load, and every kind of mistake is named."""

from __future__ import annotations

import copy

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
        ({"name": "Bad-Name"}, "name 'Bad-Name' must be a lower-case SQL identifier"),
        ({"topics": []}, "topics must be a non-empty list"),
        ({"start": "middle"}, "start 'middle' must be 'earliest', 'latest', {timestamp"),
        ({"start": {"timestamp": "2026-01-01T00:00:00"}}, "needs a time zone"),
        ({"start": {"timestamp": "yesterday"}}, "start.timestamp 'yesterday' is not an ISO 8601 date-time"),
        ({"start": {"offsets": {"page_views": {0: -1}}}}, "must be >= 0"),
        ({"start": {"offsets": {"other": {0: 5}}}}, "start.offsets names topic(s) ['other'] that are not in topics"),
        ({"topics": {"pattern": "page_(views"}}, "topics.pattern 'page_(views' is not a valid regular expression"),
        ({"topics": {"regex": "x"}}, "topics as a mapping must be {pattern: <regular expression>}"),
        ({"topics": ["a", "a"]}, "name a topic twice"),
        ({"new_partitions": "never"}, "new_partitions 'never' must be 'earliest' or 'latest'"),
        ({"on_data_loss": "ignore"}, "on_data_loss 'ignore' must be 'fail' or 'skip'"),
        ({"limits": {"max_records_per_task": 0}}, "limits.max_records_per_task must be a positive number"),
        ({"limits": {"max_records": 5}}, "unknown limits setting(s) ['max_records']"),
        ({"record": {"fields": {"page": "varchar"}}}, "record.fields.page type 'varchar' is not one of"),
        ({"record": {"fields": {"offset": "long"}}}, "clashes with the record column"),
        ({"colour": "blue"}, "unknown key(s) ['colour']"),
        ({"connections": {"redis": "x"}}, "unknown connection(s) ['redis']"),
        ({"sinks": {}}, "sinks must map one or more of ['aggregate', 'rows']"),
        ({"sinks": {"parquet": {}}}, "unknown sink(s) ['parquet']"),
        ({"sinks": {"rows": {"table": "t", "columns": {"kafka_offset": "offset"}}}}, "reserved for the record's key"),
        ({"sinks": {"rows": {"table": "t", "columns": {"page": {"expr": "page", "typ": "text"}}}}}, "unknown setting(s)"),
        ({"aggregation": {}}, "'aggregation' moved under 'sinks'"),
        # Identifiers from configuration reach SQL only once validated (and quoted).
        ({"sinks": {"aggregate": {"table": "x; DROP TABLE kafka_batch.offsets", "group_by": {}, "measures": {}}}},
         "sinks.aggregate.table 'x; DROP TABLE kafka_batch.offsets' must be a lower-case SQL identifier"),
        ({"sinks": {"rows": {"table": "t", "columns": {'p"age': "page"}}}}, "must be a lower-case SQL identifier"),
        ({"record": {"fields": {'user"; drop': "string"}}}, "record.fields name 'user\"; drop' is not a plain field name"),
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
    with pytest.raises(InputError, match=r"sinks.aggregate.measures.views type 'text' is not one of"):
        parse_pipeline(raw)


def test_two_pipelines_cannot_share_a_table(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(with_changes(name="a")))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(with_changes(name="b")))
    with pytest.raises(InputError, match="pipelines 'a' and 'b' both write table 'page_view_minutes'"):
        load_pipelines(tmp_path)


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
