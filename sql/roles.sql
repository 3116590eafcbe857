-- The pipeline's least-privilege role. Run once per database by an administrator, before the first
-- batch (`make up` and the tests do it for the embedded Postgres; docker-compose's init script too),
-- then give the role a password (ALTER ROLE kafka_batch_pipeline PASSWORD '...') and log the pipeline's
-- Postgres connection in as it. Not a numbered migration: the pipeline itself cannot grant these.
--
-- What the role may do:
--   * own the schemas kafka_batch (positions, batches, ledger, quarantine) and kafka_batch_stage
--     (per-attempt staging), so the numbered migrations and the staging tables are its own DDL;
--   * create tables in public: its sinks' target tables and the migrations ledger, which it then owns;
--     it gets no right on any other table there;
--   * nothing else: no superuser, no CREATEDB, no CREATEROLE, no replication, no bypassing row security.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kafka_batch_pipeline') THEN
        CREATE ROLE kafka_batch_pipeline LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
    END IF;
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO kafka_batch_pipeline', current_database());
END
$$;

CREATE SCHEMA IF NOT EXISTS kafka_batch AUTHORIZATION kafka_batch_pipeline;
CREATE SCHEMA IF NOT EXISTS kafka_batch_stage AUTHORIZATION kafka_batch_pipeline;
-- Only its own tables in public: others' tables stay out of reach (no default privileges are granted).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO kafka_batch_pipeline;
