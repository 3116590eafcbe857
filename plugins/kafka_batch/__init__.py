"""Exactly-once batches from Kafka offset ranges into PostgreSQL (shared by DAGs, CLI, Spark job and tests)."""
