-- Airflow run ids are unique per DAG only: the pipeline's DAG and its replay DAG can both have
-- `manual__2026-01-01T00:00:00+00:00`. A batch belongs to one run of one DAG (dag_id is null for the CLI).
ALTER TABLE kafka_batch.batches DROP CONSTRAINT IF EXISTS batches_pipeline_run_id_key;
CREATE UNIQUE INDEX IF NOT EXISTS batches_one_per_run
    ON kafka_batch.batches (pipeline, coalesce(dag_id, ''), run_id);
