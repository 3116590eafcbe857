"""Topics of 200 partitions (the bench runs 1,000): the aggregate, upsert and Kafka sinks stay exact
against ground truth read by a plain read_committed consumer, partitions with nothing new add no
ledger rows, and `status` sums the topic up instead of listing every partition."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from kafka_batch_dev import sample_data
from tests.integration.helpers import (
    _committed_messages,
    create_topic,
    ground_truth,
    kafka_config,
    new_pipeline,
    query,
    run_cli,
    table_contents,
)
from tests.integration.test_end_to_end import _transactional_page_views
from tests.integration.test_upsert import compacted, customer, produce, table, upsert_pipeline

pytestmark = pytest.mark.integration
PARTITIONS = 200


def _ledger_rows(pipeline_name: str) -> Counter:
    """Ranges per batch, as the ledger holds them."""
    return Counter(b for (b,) in query("SELECT batch_id FROM kafka_batch.ledger WHERE pipeline = %s", pipeline_name))


def test_a_topic_of_200_partitions_totals_and_publishes_every_committed_record_once(services):
    output = f"wide_{uuid.uuid4().hex[:8]}_out"
    create_topic(output, 8)
    pipeline = new_pipeline("wide", partitions=PARTITIONS, sinks={"kafka": {"topic": output, "value": {"page": "page"}}})
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 3000, seed=92, users=5000)
    _transactional_page_views(topic, transactions=6, size=50, seed=93)  # aborted ones among them
    run_cli("run", "--pipeline", pipeline.name)
    first = _ledger_rows(pipeline.name)
    assert list(first.values()) == [PARTITIONS]  # every partition had records

    # Ten partitions get more: the next batch reads those ten and records nothing for the others.
    rng = random.Random(94)
    extra = [(p, f"user_{p}", sample_data.page_view(rng)[1]) for p in range(0, PARTITIONS, 20) for _ in range(3)]
    produce(topic, extra)
    run_cli("run", "--pipeline", pipeline.name)
    assert sorted((_ledger_rows(pipeline.name) - first).values()) == [10]

    assert table_contents(pipeline) == ground_truth(topic)
    valid = [f"{topic}:{m.partition()}:{m.offset()}" for m in _committed_messages(topic, list(range(PARTITIONS)))
             if m.value() is not None]
    published = [dict((k, v.decode()) for k, v in m.headers())["kafka_batch.source"]
                 for m in _committed_messages(output, list(range(8)))]
    assert Counter(published) == Counter(dict.fromkeys(valid, 1))

    text = run_cli("status", "--pipeline", pipeline.name).stdout.splitlines()
    assert text[2].split()[:5] == [topic, str(PARTITIONS), "0", "0", "-"]  # caught up: nothing behind
    assert f"({PARTITIONS} partitions: `--partitions` lists each)" in text
    listed = run_cli("status", "--pipeline", pipeline.name, "--partitions").stdout.splitlines()
    assert len([line for line in listed if line.startswith(topic)]) == 1 + PARTITIONS


def test_a_pattern_over_20_topics_totals_and_publishes_every_committed_record_once(services):
    """A regex subscription over 20 topics of 10 partitions (the bench reads 20 of 50): every topic's
    records counted once in the totals and published once, and `status` sums up each topic."""
    prefix = f"pat{uuid.uuid4().hex[:8]}"
    topics = [f"{prefix}_{n:02}" for n in range(20)]
    for n, topic in enumerate(topics):
        create_topic(topic, 10)
        sample_data.produce_page_views(kafka_config(), topic, 60 + n, seed=200 + n)
    output = f"{prefix}out"  # outside the pattern
    create_topic(output, 4)
    pipeline = new_pipeline("pattern", partitions=0, topics={"pattern": f"{prefix}_[0-9]+"},
                            sinks={"kafka": {"topic": output, "value": {"page": "page"}}})
    run_cli("run", "--pipeline", pipeline.name)

    truth: Counter = Counter()
    durations: Counter = Counter()
    for topic in topics:
        for key, (views, duration) in ground_truth(topic).items():
            truth[key] += views
            durations[key] += duration
    assert table_contents(pipeline) == {key: (truth[key], durations[key]) for key in truth}
    valid = [f"{topic}:{m.partition()}:{m.offset()}" for topic in topics
             for m in _committed_messages(topic, list(range(10))) if m.value() is not None]
    published = [dict((k, v.decode()) for k, v in m.headers())["kafka_batch.source"]
                 for m in _committed_messages(output, list(range(4)))]
    assert Counter(published) == Counter(dict.fromkeys(valid, 1)) and len(valid) == sum(60 + n for n in range(20))

    status = json.loads(run_cli("status", "--pipeline", pipeline.name, "--json").stdout)
    assert sorted((t["topic"], t["partitions"], t["lag"]) for t in status["topics"]) == [(t, 10, 0) for t in topics]


def test_an_upsert_over_200_partitions_keeps_each_keys_latest_record(services):
    pipeline = upsert_pipeline("wide_upsert", partitions=PARTITIONS)
    topic = pipeline.topics[0]
    rng = random.Random(95)
    keys = [f"c{n}" for n in range(600)]
    for round_ in range(2):
        records = [(int(k[1:]) % PARTITIONS, k, customer(k, f"{k}-r{round_}-{n}", rng.randrange(10_000)))
                   for n in range(2) for k in rng.sample(keys, 400)]
        records += [(int(k[1:]) % PARTITIONS, k, None) for k in rng.sample(keys, 30)]  # deletes
        produce(topic, records)
        run_cli("run", "--pipeline", pipeline.name)
        assert table(pipeline) == compacted(topic)
    assert json.loads(run_cli("status", "--pipeline", pipeline.name, "--json").stdout)["topics"][0]["partitions"] == (
        PARTITIONS)


def test_status_all_lists_every_pipeline_with_its_lag_and_problems(services, tmp_path):
    """`status --all`: a line per pipeline of the folder, its lag against the topics' own counts, and
    what needs a look: a pipeline whose Postgres does not answer and an invalid file get their error on
    their own line, and the others' lines stay right."""
    behind = new_pipeline("all_behind", partitions=PARTITIONS, alerts={"max_lag_records": 10})
    sample_data.produce_page_views(kafka_config(), behind.topics[0], 1000, seed=5)
    caught_up = new_pipeline("all_done", partitions=2)
    sample_data.produce_page_views(kafka_config(), caught_up.topics[0], 30, seed=6)
    run_cli("run", "--pipeline", caught_up.name)
    session = Path(behind.source).parent
    for pipeline in (behind, caught_up):
        (tmp_path / f"{pipeline.name}.yaml").write_text((session / f"{pipeline.name}.yaml").read_text())
    broken = yaml.safe_load((session / f"{caught_up.name}.yaml").read_text())
    broken.update(name=f"{caught_up.name}_nodb", connections={**broken["connections"], "postgres": "nowhere"})
    broken["sinks"]["aggregate"]["table"] += "_nodb"
    (tmp_path / "nodb.yaml").write_text(yaml.safe_dump(broken))
    unborn = yaml.safe_load((session / f"{caught_up.name}.yaml").read_text())  # a sample no one has run yet
    unborn.update(name=f"{caught_up.name}_unborn", topics=[f"{caught_up.name}_unborn_topic"])
    unborn["sinks"]["aggregate"]["table"] += "_unborn"
    (tmp_path / "unborn.yaml").write_text(yaml.safe_dump(unborn))
    (tmp_path / "invalid.yaml").write_text("name: invalid\ntopics: [x]\ncolour: red\n")
    env = {"KAFKA_BATCH_PIPELINES_DIR": str(tmp_path)}

    lines = json.loads(run_cli("status", "--all", "--json", env=env).stdout)["pipelines"]
    by_name = {line["pipeline"]: line for line in lines}
    committed_records = sum(1 for m in _committed_messages(behind.topics[0], list(range(PARTITIONS))) if m.value())
    assert by_name[behind.name]["lag"] == committed_records > 0
    assert by_name[behind.name]["partitions"] == PARTITIONS and by_name[behind.name]["last_batch"] is None
    assert by_name[behind.name]["behind"] == [f"lag {committed_records} records over max_lag_records 10"]
    assert by_name[caught_up.name]["lag"] == 0 and by_name[caught_up.name]["last_batch"]["status"] == "committed"
    assert by_name[caught_up.name]["error"] is None and by_name[behind.name]["error"] is None
    assert "nowhere" in by_name[f"{caught_up.name}_nodb"]["error"]
    assert "colour" in by_name[None]["error"] and by_name[None]["file"].endswith("invalid.yaml")
    never_ran = by_name[f"{caught_up.name}_unborn"]  # not an error: it has not started
    assert never_ran["error"] is None and never_ran["last_batch"] is None, never_ran
    assert never_ran["not_started"] == f"not started: topic '{caught_up.name}_unborn_topic' does not exist", never_ran

    table = run_cli("status", "--all", env=env).stdout
    assert behind.name in table and caught_up.name in table and "(invalid.yaml)" in table
    assert "not started: topic" in table
    checked = run_cli("status", "--all", "--check", env=env, check=False)
    assert checked.returncode == 7 and "3 pipeline(s) need a look" in checked.stderr
