"""What `status` and the console sum up per topic, for pipelines of many partitions."""

from __future__ import annotations

from kafka_batch.core.report import TopicStatus, topic_totals


def test_a_topics_totals_name_its_partitions_most_behind():
    rows = [("a", p, lag, batch) for p, lag, batch in [(0, 0, 4), (1, 50, 3), (2, 7, None), (3, 900, 5), (4, 2, 4)]]
    rows.append(("b", 0, 0, None))
    assert topic_totals(rows) == [TopicStatus("a", 5, 959, 4, ((3, 900), (1, 50), (2, 7)), 5),
                                  TopicStatus("b", 1, 0, 0, (), None)]
    assert topic_totals(rows, worst=1)[0].worst == ((3, 900),)


def test_the_report_task_says_what_a_batch_did_in_a_sentence():
    from kafka_batch.core.report import sentence

    base = {"kind": "batch", "batch_id": 13, "lag": 0, "records_invalid": None}
    assert sentence({**base, "status": "empty", "records_read": None}) == (
        "batch 13 was empty: no new records to read; lag now 0")
    assert sentence({**base, "status": "committed", "records_read": 12_000, "records_invalid": 3, "lag": 1500}) == (
        "batch 13 is committed: 12,000 records read, 3 quarantined; lag now 1,500")
    assert sentence({**base, "kind": "replay", "status": "committed", "records_read": 10, "records_invalid": 0}) == (
        "replay 13 is committed: 10 records read; lag now 0")
    assert sentence({**base, "status": "failed", "records_read": None, "lag": None, "lag_error": "no answer"}) == (
        "batch 13 is failed: nothing read yet; lag now unknown (no answer)")
    assert "None" not in sentence({**base, "status": "planned", "records_read": None})
