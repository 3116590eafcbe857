-- Truncation below a committed position (an unclean leader election): each position keeps the partition's
-- leader epoch at the offset it was moved to, so a later plan can ask the partition's leader, by that
-- epoch, whether its log still holds what was read (Kafka's own check, KIP-320). A range keeps the epoch
-- its commit stores, and under on_data_loss=skip where the log stopped holding what was committed below it.
ALTER TABLE kafka_batch.offsets ADD COLUMN IF NOT EXISTS leader_epoch integer;
ALTER TABLE kafka_batch.batch_ranges
    ADD COLUMN IF NOT EXISTS until_epoch integer,
    ADD COLUMN IF NOT EXISTS truncated_from bigint;
ALTER TABLE kafka_batch.batch_ranges DROP CONSTRAINT IF EXISTS batch_ranges_truncated_from_check;
ALTER TABLE kafka_batch.batch_ranges ADD CONSTRAINT batch_ranges_truncated_from_check
    CHECK (truncated_from IS NULL OR (truncated_from >= 0 AND truncated_from < from_offset));
