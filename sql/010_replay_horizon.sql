-- The replay horizon (a pipeline's `replayable` setting): a committed range beyond it is folded, its
-- per-range state (the aggregate's contributions) merged into a base that keeps the totals, and it can
-- no longer be replayed or rewound range by range.
ALTER TABLE kafka_batch.batch_ranges ADD COLUMN IF NOT EXISTS folded_at timestamptz;
