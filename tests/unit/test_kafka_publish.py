"""The decision an attempt of a Kafka-publishing batch takes from what Kafka and Postgres say."""

from __future__ import annotations

import pytest

from kafka_batch.errors import ServiceError
from kafka_batch.kafka.publish import Decision, Published, _service_error, decide, transactional_id


def test_an_identity_round_trips_through_an_offsets_metadata():
    identity = Published(12, 3, "replay")
    assert Published.from_metadata(identity.metadata()) == identity
    assert Published.from_metadata("") is None and Published.from_metadata('{"other": 1}') is None
    assert len(identity.metadata()) < 100  # Kafka keeps 4096 bytes of metadata by default


def test_found_committed_or_blocked():
    assert decide(5, [], {5: "running"}) is Decision.PUBLISH
    assert decide(5, [Published(4, 1, "batch")], {5: "running"}) is Decision.PUBLISH  # batch 4 committed in Postgres
    assert decide(5, [Published(4, 1, "batch"), Published(5, 2, "batch")], {5: "running"}) is Decision.COMPLETE
    with pytest.raises(ServiceError, match=r"batch 4 is published to Kafka and not yet committed to Postgres \(running\)"):
        decide(5, [Published(4, 1, "batch")], {4: "running", 5: "running"})


def test_one_transactional_id_per_pipeline_and_topic():
    assert transactional_id("page_views", "totals") == "kafka-batch.page_views.totals"


def test_a_transaction_the_broker_lost_is_said_to_have_published_nothing():
    from confluent_kafka import KafkaError, KafkaException

    lost = KafkaException(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "unknown producer id", txn_requires_abort=True))
    assert str(_service_error("publishing batch 7 to 'out'", lost)) == (
        "publishing batch 7 to 'out': unknown producer id; nothing of the transaction is visible, a new attempt"
        " publishes the batch")
    down = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    assert str(_service_error("publishing batch 7 to 'out'", down)) == "publishing batch 7 to 'out': broker down"
