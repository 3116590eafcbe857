-- What a committed batch published to Kafka, per output topic of its Kafka sinks: the messages its
-- committing attempt produced and the seconds its publish took (fence, produce, Kafka commit), for metrics.
ALTER TABLE kafka_batch.batches ADD COLUMN IF NOT EXISTS published jsonb;
