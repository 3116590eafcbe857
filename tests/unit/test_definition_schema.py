"""The typed model of a pipeline definition: its JSON Schema (what editors check YAML with) and its
reference are what is committed, the samples point at the schema and pass it, a misspelled field fails
it, and snapshots stored with batches before the model existed still load and read the same."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from kafka_batch.cli import reference
from kafka_batch.config import PROJECT_ROOT, from_snapshot, load_pipelines, parse_pipeline, schema

PIPELINES = PROJECT_ROOT / "pipelines"
SCHEMA_FILE = PIPELINES / "pipeline.schema.json"
SAMPLES = sorted(PIPELINES.glob("*.yaml"))
MODELINE = "# yaml-language-server: $schema=./pipeline.schema.json"


def _validator() -> jsonschema.Draft202012Validator:
    committed = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(committed)
    return jsonschema.Draft202012Validator(committed)


def test_the_committed_schema_and_reference_are_the_models(tmp_path):
    assert SCHEMA_FILE.read_text() == reference.schema_text(), "stale: run `make schema`"
    assert (PROJECT_ROOT / "docs" / "configuration.md").read_text() == reference.markdown(), "stale: run `make schema`"


def test_every_field_is_described_by_its_docstring():
    """The descriptions come from the models' source when the schema is made (model.DescribedSchema), not
    at class creation: every field has one, its own or its section's."""
    full = schema()
    defs = full["$defs"]

    def resolved(node: dict) -> dict:
        return defs[node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else node

    undescribed = [f"{name}.{field}" for name, model in [("Pipeline", full), *defs.items()]
                   for field, node in model.get("properties", {}).items()
                   if "description" not in node and "description" not in resolved(node)]
    assert undescribed == []
    assert full["properties"]["read"]["description"] == "How the read tasks and the planner talk to Kafka."
    assert defs["Limits"]["properties"]["max_value_bytes"]["description"] == (
        "A record value larger than this is invalid (quarantined).")


def test_kafka_batch_schema_prints_it():
    cli = Path(sys.executable).parent / "kafka-batch"
    printed = subprocess.run([str(cli), "schema"], capture_output=True, text=True, check=True).stdout
    assert json.loads(printed) == schema()
    markdown = subprocess.run([str(cli), "schema", "--markdown"], capture_output=True, text=True, check=True).stdout
    assert "| `sinks.aggregate.measures.<column>.type` |" in markdown


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_each_sample_points_at_the_schema_and_passes_it(sample):
    assert len(SAMPLES) >= 2
    assert sample.read_text().splitlines()[0] == MODELINE
    _validator().validate(yaml.safe_load(sample.read_text()))


@pytest.mark.parametrize("path", [("limts",), ("sinks", "aggregate", "measurs"), ("read", "poll_timeout_secs"),
                                  ("sinks", "aggregate", "group_by", "page", "exp")])
def test_a_misspelled_field_fails_the_schema(path):
    raw = yaml.safe_load((PIPELINES / "page_views.yaml").read_text())
    where = raw
    for part in path[:-1]:
        where = where.setdefault(part, {})
    where[path[-1]] = "x"
    errors = list(_validator().iter_errors(raw))
    assert errors, path
    assert any(repr(path[-1]) in e.message or path[-1] in json.dumps(e.instance) for e in errors), errors


def test_values_the_loader_refuses_fail_the_schema_too():
    base = yaml.safe_load((PIPELINES / "page_views.yaml").read_text())
    for changes in ({"start": "middle"}, {"new_partitions": "never"}, {"limits": {"max_records_per_task": 0}},
                    {"record": {"fields": {"page": "varchar"}}}, {"name": "Bad-Name"}, {"topics": []}):
        raw = {**copy.deepcopy(base), **changes}
        assert list(_validator().iter_errors(raw)), changes


def _read_as(pipeline) -> dict:
    """What the rest of the code reads from a pipeline (the attributes the snapshots' writer recorded)."""
    return {
        "name": pipeline.name, "topics": list(pipeline.topics), "topic_pattern": pipeline.topic_pattern,
        "start": {"kind": pipeline.start.kind, "timestamp_ms": pipeline.start.timestamp_ms,
                  "offsets": [[t, p, o] for (t, p), o in sorted(pipeline.start.offsets.items())]},
        "new_partitions": pipeline.new_partitions, "plan_by": pipeline.plan_by, "schedule": pipeline.schedule,
        "on_data_loss": pipeline.on_data_loss, "on_invalid_record": pipeline.on_invalid_record,
        "fields": pipeline.fields,
        "sinks": [{"kind": s.kind, "table": s.table,
                   "columns": {k: [[c.name, c.expr, c.type] for c in getattr(s, k)]
                               for k in ("group_by", "measures", "columns") if hasattr(s, k)}} for s in pipeline.sinks],
        "limits": pipeline.limits.model_dump(), "read": pipeline.read.model_dump(),
        "replayable": pipeline.replayable.model_dump(),
        "connections": pipeline.connections.model_dump(include={"kafka", "postgres", "spark"}),  # what they had
    }


def test_snapshots_stored_before_the_typed_model_load_and_read_the_same():
    # Written by the hand-checked loader this model replaced (config.py as of commit 47a969a), with what it read.
    old = json.loads((Path(__file__).parent / "snapshots_before_typed_model.json").read_text())
    assert len(old) == 4
    for stored in old:
        pipeline = from_snapshot(json.loads(stored["snapshot"]), source="an old batch")
        assert pipeline.definition_hash == stored["hash"]  # same definition, same hash: no batch looks changed
        assert _read_as(pipeline) == stored["read_as"]


def test_every_sample_loads():
    assert {p.name for p in load_pipelines(PIPELINES).values()} == {s.stem for s in SAMPLES}


BASE = {"name": "example", "topics": "example", "record": {"fields": {"x": "string"}},
        "sinks": {"rows": {"table": "example", "columns": {"x": "x"}}}}


def test_the_guide_examples_are_valid_definitions():
    """The README's example and the getting-started pipeline are whole definitions; every other YAML
    block of README.md and docs/ is a fragment, valid once put over a minimal definition (its keys win)."""
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
    blocks = [(page, block.split("```", 1)[0]) for page in pages for block in page.read_text().split("```yaml\n")[1:]]
    whole = [block for _, block in blocks if block.startswith(MODELINE) and yaml.safe_load(block)]
    assert len(whole) >= 3  # the README's, writing pipelines', getting started's
    kinds = set()
    for page, block in blocks:
        raw = yaml.safe_load(block)
        if raw is None:  # the modeline alone, as docs/configuration.md shows it
            continue
        if not block.startswith(MODELINE):
            raw = {**BASE, **raw}
        _validator().validate(raw)
        kinds |= {s.kind for s in parse_pipeline(raw, source=str(page.relative_to(PROJECT_ROOT))).sinks}
    assert kinds == {"aggregate", "rows", "upsert", "kafka"}
