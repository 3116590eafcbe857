"""What `status` and the console sum up per topic, for pipelines of many partitions."""

from __future__ import annotations

from kafka_batch.core.report import TopicStatus, topic_totals


def test_a_topics_totals_name_its_partitions_most_behind():
    rows = [("a", p, lag, batch) for p, lag, batch in [(0, 0, 4), (1, 50, 3), (2, 7, None), (3, 900, 5), (4, 2, 4)]]
    rows.append(("b", 0, 0, None))
    assert topic_totals(rows) == [TopicStatus("a", 5, 959, 4, ((3, 900), (1, 50), (2, 7)), 5),
                                  TopicStatus("b", 1, 0, 0, (), None)]
    assert topic_totals(rows, worst=1)[0].worst == ((3, 900),)
