#!/bin/bash
# Postgres container init (docker-compose.yml): the pipeline database and its user.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
CREATE USER kafka_batch WITH PASSWORD '${KAFKA_BATCH_DB_PASSWORD}';
CREATE DATABASE kafka_batch OWNER kafka_batch;
SQL
