-- Sinks and definition snapshots. A batch records the canonical definition it was planned with, so
-- every attempt computes the same thing and the ledger says which definition produced each range.
CREATE TABLE IF NOT EXISTS kafka_batch.definitions (
    hash           text PRIMARY KEY,  -- sha256 of the definition's compact JSON
    pipeline       text  NOT NULL REFERENCES kafka_batch.pipelines (name),
    definition     json  NOT NULL,  -- json, not jsonb: key order is column order
    first_used_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE kafka_batch.batches
    ADD COLUMN IF NOT EXISTS definition_hash text REFERENCES kafka_batch.definitions (hash),
    -- How many Spark read tasks the job really ran (observed from the job, not recomputed).
    ADD COLUMN IF NOT EXISTS read_tasks integer;

-- A preview row belongs to one sink's table; keys of different sinks may look alike.
ALTER TABLE kafka_batch.replay_previews ADD COLUMN IF NOT EXISTS target text NOT NULL DEFAULT '';
ALTER TABLE kafka_batch.replay_previews DROP CONSTRAINT IF EXISTS replay_previews_pkey;
ALTER TABLE kafka_batch.replay_previews ADD CONSTRAINT replay_previews_pkey PRIMARY KEY (batch_id, target, group_key);

-- Where executors stage an attempt's rows before the commit moves them (one table per attempt).
-- Created here only when missing: the least-privilege role (sql/roles.sql) owns it already and may not
-- create schemas (CREATE SCHEMA IF NOT EXISTS would still need that right).
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'kafka_batch_stage') THEN CREATE SCHEMA kafka_batch_stage; END IF;
END $$;

-- Every committed range, live or retired, with the batch and the definition that produced it.
CREATE OR REPLACE VIEW kafka_batch.ledger AS
SELECT r.id AS range_id, b.pipeline, r.topic, r.partition, r.from_offset, r.until_offset, r.lost_until,
       r.records_read, r.records_tombstone, b.id AS batch_id, b.kind, b.dag_id, b.run_id, b.try_number,
       b.committed_at, b.definition_hash, r.replaces_range_id, r.retired_at, r.retired_by
FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b ON b.id = r.batch_id
WHERE b.status = 'committed';
