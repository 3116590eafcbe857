-- Expressions Spark's analyzer resolved (kafka_batch.spark.analysis), by a hash of what its verdict depends
-- on: the record's section, each expression with its type, Spark's version. Only the first plan of each asks.
CREATE TABLE IF NOT EXISTS kafka_batch.analyzed_definitions (
    hash         text PRIMARY KEY,  -- kafka_batch.spark.analysis.analysis_key
    analyzed_at  timestamptz NOT NULL DEFAULT now()
);
