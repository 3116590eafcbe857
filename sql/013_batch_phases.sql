-- How long a committed batch's attempt spent in Spark (reading the ranges and computing the sinks'
-- results: one pass) and in its commit transaction's statements: the batch's phases for metrics.
ALTER TABLE kafka_batch.batches ADD COLUMN IF NOT EXISTS read_seconds double precision;
ALTER TABLE kafka_batch.batches ADD COLUMN IF NOT EXISTS commit_seconds double precision;
