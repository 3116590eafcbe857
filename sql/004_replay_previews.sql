-- A replay's dry run: recomputed by Spark, compared with what its ranges contribute now, not committed.
ALTER TABLE kafka_batch.batches DROP CONSTRAINT IF EXISTS batches_status_check;
ALTER TABLE kafka_batch.batches ADD CONSTRAINT batches_status_check
    CHECK (status IN ('planned', 'empty', 'committed', 'failed', 'superseded', 'previewed'));
CREATE TABLE IF NOT EXISTS kafka_batch.replay_previews (
    batch_id   bigint NOT NULL REFERENCES kafka_batch.batches (id),
    group_key  jsonb  NOT NULL,
    before     jsonb,  -- the measures the replayed ranges contribute now; null: the key is new
    after      jsonb,  -- the measures they would contribute; null: the key would go
    PRIMARY KEY (batch_id, group_key)
);
