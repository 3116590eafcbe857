"""An input topic compacted by Apache Kafka's log cleaner, read by the aggregate, rows and upsert sinks: a
batch before the cleaner ran, one after it, across offsets it left as holes, tombstones it keeps, and
records it removed after a batch had read them.

Ground truth is the topic read by a plain read_committed consumer (tests/integration/helpers.py): before
the cleaner for what the first batch read, after it for the rest. The upsert table must equal the
compacted topic (the test's own compaction of what the cleaner left: the last record per key, a
tombstone removing it); the aggregate and rows sinks hold what each batch read when it read it.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.integration.helpers import (
    COMPACTED,
    _committed_messages,
    _partitions,
    compact,
    ground_truth,
    merged,
    new_pipeline,
    positions,
    rows_contents,
    rows_truth,
    run_cli,
    table_contents,
)
from tests.integration.test_upsert import compacted, produce, table, upsert_pipeline

pytestmark = pytest.mark.integration


def view(key: str, version: int) -> dict:
    """A record both pipelines read: a customer (the upsert sink's fields) who viewed a page."""
    return {"customer_id": key, "name": f"{key}-v{version}", "balance": 10 * version, "updated_at": version,
            "user_id": key, "page": f"/p{version % 3}", "duration_ms": 100 + version}


def test_a_compacted_topic_is_read_exactly_by_the_aggregate_rows_and_upsert_sinks(services):
    upsert = upsert_pipeline("compactedu", partitions=2, topic_config=COMPACTED)
    topic = upsert.topics[0]
    totals = new_pipeline(f"compacteda_{uuid.uuid4().hex[:4]}", partitions=0, rows=True, topics=[topic])
    keys = [f"k{n}" for n in range(12)]

    # Each key twice, then the first batch of both pipelines reads every record.
    produce(topic, [(n % 2, k, view(k, v)) for v in (1, 2) for n, k in enumerate(keys)])
    read_first = list(_committed_messages(topic, _partitions(topic)))
    for pipeline in (upsert, totals):
        run_cli("run", "--pipeline", pipeline.name)
    first = positions(totals.name)

    # Then: updates written twice (the cleaner leaves holes where the first copies were), tombstones, new keys.
    produce(topic, [(n % 2, k, view(k, v)) for v in (3, 4) for n, k in enumerate(keys[:6])]
            + [(n % 2, k, None) for n, k in enumerate(keys) if 6 <= n < 9]
            + [(n % 2, f"new{n}", view(f"new{n}", v)) for v in (5, 6) for n in range(4)])
    rolled = compact(topic)
    after = list(_committed_messages(topic, _partitions(topic)))

    kept = {(m.partition(), m.offset()) for m in after}
    read_and_removed = [m for m in read_first if (m.partition(), m.offset()) not in kept]
    unread = [m for m in after if m.offset() >= first[(topic, m.partition())]]
    holes = {p: set(range(first[(topic, p)], rolled[p])) - {m.offset() for m in unread if m.partition() == p}
             for p in rolled}
    assert read_and_removed, "the cleaner removed none of the records the first batch read"
    assert all(holes.values()), f"the cleaner left no hole in the unread offsets: {holes}"
    assert sum(m.value() is None for m in unread) == 3  # the tombstones are kept

    for pipeline in (upsert, totals):
        run_cli("run", "--pipeline", pipeline.name)

    ends = {(topic, p): o + 1 for p, o in rolled.items()}
    assert positions(upsert.name) == positions(totals.name) == ends
    assert table(upsert) == compacted(topic)  # the table equals the compacted topic
    assert table_contents(totals) == merged(ground_truth(topic, messages=read_first),
                                            ground_truth(topic, messages=unread))
    assert rows_contents(totals) == {**rows_truth(topic, messages=read_first), **rows_truth(topic, messages=unread)}


def test_the_log_cleaner_keeps_each_keys_last_record(services):
    """The premise of the test above: what `compact` waits for is Kafka's cleaner at work."""
    upsert = upsert_pipeline("compactedp", partitions=1, topic_config=COMPACTED)
    topic = upsert.topics[0]
    produce(topic, [(0, "a", view("a", v)) for v in range(5)] + [(0, "b", view("b", 1))])
    rolled = compact(topic)
    assert [(m.offset(), m.key(), json.loads(m.value())["updated_at"]) for m in _committed_messages(topic, [0])] == [
        (4, b"a", 4), (5, b"b", 1), (rolled[0], b"b", 1)]
