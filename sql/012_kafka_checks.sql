-- The transactional check of each Kafka cluster (kafka_batch.kafka_check): its findings and whether a
-- read_committed read there returns exactly the committed records. A batch refuses to read from a
-- cluster whose latest check says it may not (core/kafka_checks.py).
CREATE TABLE IF NOT EXISTS kafka_batch.kafka_checks (
    cluster_id text PRIMARY KEY,
    bootstrap_servers text NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT now(),
    reads_safe boolean NOT NULL,
    findings jsonb NOT NULL
);
