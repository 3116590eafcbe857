-- How far the pipeline was behind the last stable offsets when a batch was planned (offsets, summed
-- over its partitions, before the batch): with the ledger's records per batch, the console's lag over time.
ALTER TABLE kafka_batch.batches ADD COLUMN IF NOT EXISTS lag_at_plan bigint;
