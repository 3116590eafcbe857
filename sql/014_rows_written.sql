-- The rows a committed batch changed in each output table (sink table -> rows), for lineage.
ALTER TABLE kafka_batch.batches ADD COLUMN IF NOT EXISTS rows_written jsonb;
