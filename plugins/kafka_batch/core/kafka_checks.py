"""The verdicts of the transactional check, per Kafka cluster, and the refusal to read where it failed.

Nothing in a batch can see that a broker dropped committed records from a read_committed answer: the
records are simply not there, and the position would move past them. So the broker is checked once per
cluster (kafka_batch.kafka.check) and the verdict kept here; a batch reads only from a cluster whose
latest verdict is safe, or that was never checked (then it says so in its log).
"""

from __future__ import annotations

import json
import logging

from kafka_batch.core.database import apply_migrations, transaction
from kafka_batch.errors import UnsafeBroker
from kafka_batch.kafka.check import KafkaCheck, check_cluster

log = logging.getLogger("kafka_batch.kafka_checks")


def check_and_record(conn, kafka: dict) -> KafkaCheck:
    """Check the cluster of these librdkafka settings and keep the verdict."""
    check = check_cluster(kafka)
    apply_migrations(conn)
    record(conn, check)
    return check


def describe(check: KafkaCheck) -> list[str]:
    """The check as lines for a terminal: one per finding, then the verdict."""
    verdict = ("batches read from it" if check.reads_safe else
               f"batches refuse to read from it (exit {UnsafeBroker.exit_code}) until a check passes")
    return [f"Kafka cluster {check.cluster_id} ({check.bootstrap_servers}):",
            *(f"  {finding.line()}" for finding in check.findings), f"verdict recorded: {verdict}"]


def record(conn, check: KafkaCheck) -> None:
    """Keep a check's verdict as the cluster's latest."""
    with transaction(conn) as cur:
        cur.execute(
            "INSERT INTO kafka_batch.kafka_checks (cluster_id, bootstrap_servers, reads_safe, findings)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (cluster_id) DO UPDATE SET bootstrap_servers ="
            " EXCLUDED.bootstrap_servers, checked_at = now(), reads_safe = EXCLUDED.reads_safe,"
            " findings = EXCLUDED.findings",
            (check.cluster_id, check.bootstrap_servers, check.reads_safe, json.dumps(check.as_json())),
        )


def refuse_unsafe_reads(conn, cluster_id: str, batch_id: int) -> None:
    """UnsafeBroker if the cluster's latest check found that a read could skip or show wrong records."""
    with transaction(conn) as cur:
        cur.execute("SELECT checked_at, reads_safe, findings FROM kafka_batch.kafka_checks WHERE cluster_id = %s",
                    (cluster_id,))
        row = cur.fetchone()
    if row is None:
        log.warning("Kafka cluster %s has never been checked (kafka-batch check-kafka): batch %s reads trusting its"
                    " read_committed answers", cluster_id, batch_id)
        return
    checked_at, safe, findings = row
    if not safe:
        failed = "; ".join(f["text"] for f in findings if f["reads"] and not f["ok"])
        raise UnsafeBroker(
            f"batch {batch_id} reads nothing and commits nothing: the transactional check of Kafka cluster"
            f" {cluster_id} at {checked_at:%Y-%m-%d %H:%M:%S %Z} found that {failed}. Fix the broker (or put the"
            " pipeline on one that passes), then run `kafka-batch check-kafka` again")
