-- Contribution tables (kafka_batch.<table>__by_range) lose the per-row foreign key to batch_ranges:
-- a commit COPYs its rows straight in and checks them once, as a set (sinks/aggregate.py). Range ids
-- only grow, so a BRIN index on range_id finds a range's rows for removal and previews.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT con.conname, cls.relname
        FROM pg_constraint con
        JOIN pg_class cls ON cls.oid = con.conrelid
        JOIN pg_namespace ns ON ns.oid = cls.relnamespace
        WHERE ns.nspname = 'kafka_batch' AND cls.relname LIKE '%\_\_by\_range' AND con.contype = 'f'
          AND con.confrelid = 'kafka_batch.batch_ranges'::regclass
    LOOP
        EXECUTE format('ALTER TABLE kafka_batch.%I DROP CONSTRAINT %I', c.relname, c.conname);
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON kafka_batch.%I USING brin (range_id) WITH (autosummarize = on)',
                       left(c.relname || '_range', 63), c.relname);
    END LOOP;
END
$$;
