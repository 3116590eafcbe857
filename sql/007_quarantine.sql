-- Records a pipeline cannot process (not valid JSON, missing or mistyped fields, a null key, an
-- oversized value), kept with their reason, written in the batch's commit transaction. A replay or a
-- rewind of a range removes its rows here (the replay writes what it decides anew).
CREATE TABLE IF NOT EXISTS kafka_batch.quarantine (
    range_id        bigint  NOT NULL REFERENCES kafka_batch.batch_ranges (id),
    "offset"        bigint  NOT NULL,
    pipeline        text    NOT NULL REFERENCES kafka_batch.pipelines (name),
    batch_id        bigint  NOT NULL REFERENCES kafka_batch.batches (id),
    topic           text    NOT NULL,
    partition       integer NOT NULL,
    "timestamp"     timestamptz,
    key             bytea,
    value           bytea,             -- the first bytes of the value (value_bytes is its full length)
    value_bytes     integer NOT NULL,
    reason          text    NOT NULL,
    quarantined_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (range_id, "offset")
);
CREATE INDEX IF NOT EXISTS quarantine_pipeline_idx ON kafka_batch.quarantine (pipeline, topic, partition, "offset");

ALTER TABLE kafka_batch.batch_ranges ADD COLUMN IF NOT EXISTS records_invalid bigint;
ALTER TABLE kafka_batch.batches ADD COLUMN IF NOT EXISTS records_invalid bigint;
