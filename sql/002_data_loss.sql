-- Data loss under on_data_loss=skip: records deleted (retention, delete-records) before they were read.
-- A range keeps from_offset = the stored position (so the commit's compare-and-set holds) and says in
-- lost_until where the readable part begins; the commit copies the lost part into data_loss.
ALTER TABLE kafka_batch.batch_ranges
    ADD COLUMN IF NOT EXISTS lost_until bigint,
    ADD COLUMN IF NOT EXISTS lost_detected_at timestamptz;
ALTER TABLE kafka_batch.batch_ranges DROP CONSTRAINT IF EXISTS batch_ranges_lost_until_check;
ALTER TABLE kafka_batch.batch_ranges ADD CONSTRAINT batch_ranges_lost_until_check
    CHECK (lost_until IS NULL OR (lost_until > from_offset AND lost_until <= until_offset));

-- Every gap a committed batch moved past, forever: what was lost, when it was seen, which batch.
CREATE TABLE IF NOT EXISTS kafka_batch.data_loss (
    id           bigserial PRIMARY KEY,
    pipeline     text    NOT NULL REFERENCES kafka_batch.pipelines (name),
    topic        text    NOT NULL,
    partition    integer NOT NULL,
    lost_from    bigint  NOT NULL,
    lost_until   bigint  NOT NULL,
    detected_at  timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    batch_id     bigint  NOT NULL REFERENCES kafka_batch.batches (id),
    CHECK (lost_until > lost_from)
);
CREATE INDEX IF NOT EXISTS data_loss_pipeline_idx ON kafka_batch.data_loss (pipeline, topic, partition);
