-- Which schemas wrote a committed range's values: the Schema Registry ids of its records (Avro and
-- Protobuf in the Confluent wire format; null for other formats), so the ledger says which versions a
-- range held. Recorded by the commit from what the read tasks saw.
ALTER TABLE kafka_batch.batch_ranges ADD COLUMN IF NOT EXISTS schema_ids integer[];

CREATE OR REPLACE VIEW kafka_batch.ledger AS
SELECT r.id AS range_id, b.pipeline, r.topic, r.partition, r.from_offset, r.until_offset, r.lost_until,
       r.records_read, r.records_tombstone, b.id AS batch_id, b.kind, b.dag_id, b.run_id, b.try_number,
       b.committed_at, b.definition_hash, r.replaces_range_id, r.retired_at, r.retired_by, r.schema_ids
FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b ON b.id = r.batch_id
WHERE b.status = 'committed';
