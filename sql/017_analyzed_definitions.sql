-- Definitions whose expressions Spark's analyzer resolved (kafka_batch.spark.analysis), by the hash of the
-- definition: only the first plan of each definition asks Spark.
CREATE TABLE IF NOT EXISTS kafka_batch.analyzed_definitions (
    hash         text PRIMARY KEY,  -- sha256 of the definition's compact JSON (kafka_batch.definitions.hash)
    analyzed_at  timestamptz NOT NULL DEFAULT now()
);
