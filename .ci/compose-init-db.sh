#!/bin/bash
# Postgres container init (docker-compose.yml): the pipeline database and its least-privilege role
# (sql/roles.sql), whose password comes from .env.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
CREATE DATABASE kafka_batch;
SQL
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname kafka_batch -f /kafka-batch-sql/roles.sql
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname kafka_batch -v password="$KAFKA_BATCH_DB_PASSWORD" <<'SQL'
ALTER ROLE kafka_batch_pipeline PASSWORD :'password';
SQL
