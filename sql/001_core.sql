-- Core bookkeeping: positions, batches and their ranges. Idempotent; applied by kafka_batch.core.database.
-- Created here only when missing: the least-privilege role (sql/roles.sql) owns it already and may not
-- create schemas (CREATE SCHEMA IF NOT EXISTS would still need that right).
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'kafka_batch') THEN CREATE SCHEMA kafka_batch; END IF;
END $$;

-- One row per configured pipeline; locked FOR UPDATE to serialize planning and commits of a pipeline.
CREATE TABLE IF NOT EXISTS kafka_batch.pipelines (
    name        text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The position: the next offset to read. The only record of progress.
CREATE TABLE IF NOT EXISTS kafka_batch.offsets (
    pipeline     text    NOT NULL REFERENCES kafka_batch.pipelines (name),
    topic        text    NOT NULL,
    partition    integer NOT NULL CHECK (partition >= 0),
    next_offset  bigint  NOT NULL CHECK (next_offset >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    batch_id     bigint,
    PRIMARY KEY (pipeline, topic, partition)
);

CREATE TABLE IF NOT EXISTS kafka_batch.batches (
    id            bigserial PRIMARY KEY,
    pipeline      text    NOT NULL REFERENCES kafka_batch.pipelines (name),
    dag_id        text,
    run_id        text    NOT NULL,
    status        text    NOT NULL CHECK (status IN ('planned', 'empty', 'committed', 'failed', 'superseded')),
    attempt       integer NOT NULL DEFAULT 0,
    planned_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    committed_at  timestamptz,
    records_read       bigint,
    records_tombstone  bigint,
    error         text,
    UNIQUE (pipeline, run_id)
);

-- The ranges of a batch; once committed, the ledger of what moved each position.
CREATE TABLE IF NOT EXISTS kafka_batch.batch_ranges (
    id                 bigserial PRIMARY KEY,
    batch_id           bigint  NOT NULL REFERENCES kafka_batch.batches (id),
    topic              text    NOT NULL,
    partition          integer NOT NULL CHECK (partition >= 0),
    from_offset        bigint  NOT NULL CHECK (from_offset >= 0),
    until_offset       bigint  NOT NULL,
    records_read       bigint,
    records_tombstone  bigint,
    CHECK (until_offset > from_offset),
    UNIQUE (batch_id, topic, partition)
);
CREATE INDEX IF NOT EXISTS batch_ranges_partition_idx
    ON kafka_batch.batch_ranges (topic, partition, from_offset);
