-- The range ledger: replays and resets. A committed range stays recorded forever; when a replay
-- recomputes it or a rewind removes it, it is retired (its contributions leave the totals) and the
-- replacing range or the reset says why.
ALTER TABLE kafka_batch.batches
    ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'batch',
    ADD COLUMN IF NOT EXISTS try_number integer,
    ADD COLUMN IF NOT EXISTS requested_by text,
    ADD COLUMN IF NOT EXISTS reason text;
ALTER TABLE kafka_batch.batches DROP CONSTRAINT IF EXISTS batches_kind_check;
ALTER TABLE kafka_batch.batches ADD CONSTRAINT batches_kind_check CHECK (kind IN ('batch', 'replay'));

ALTER TABLE kafka_batch.batch_ranges
    ADD COLUMN IF NOT EXISTS replaces_range_id bigint REFERENCES kafka_batch.batch_ranges (id),
    ADD COLUMN IF NOT EXISTS retired_at timestamptz,
    ADD COLUMN IF NOT EXISTS retired_by text;
-- A replay may recompute several consecutive ranges of one partition.
ALTER TABLE kafka_batch.batch_ranges DROP CONSTRAINT IF EXISTS batch_ranges_batch_id_topic_partition_key;
CREATE UNIQUE INDEX IF NOT EXISTS batch_ranges_one_per_partition
    ON kafka_batch.batch_ranges (batch_id, topic, partition) WHERE replaces_range_id IS NULL;

-- Every deliberate move of a position (rewind or skip), with who, when and why.
CREATE TABLE IF NOT EXISTS kafka_batch.resets (
    id              bigserial PRIMARY KEY,
    pipeline        text    NOT NULL REFERENCES kafka_batch.pipelines (name),
    topic           text    NOT NULL,
    partition       integer NOT NULL,
    from_position   bigint  NOT NULL,
    to_position     bigint  NOT NULL,
    direction       text    NOT NULL CHECK (direction IN ('rewind', 'skip')),
    ranges_retired  integer NOT NULL DEFAULT 0,
    requested_by    text    NOT NULL,
    reason          text    NOT NULL,
    reset_at        timestamptz NOT NULL DEFAULT now()
);

-- The committed ranges whose contributions are in the totals now.
CREATE OR REPLACE VIEW kafka_batch.live_ranges AS
SELECT r.*, b.pipeline, b.kind, b.dag_id, b.run_id, b.try_number, b.committed_at
FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b ON b.id = r.batch_id
WHERE b.status = 'committed' AND r.retired_at IS NULL;
