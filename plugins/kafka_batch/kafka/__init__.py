"""Kafka access: offset ranges, offsets and reading (source), publishing in transactions (publish), and the
check of a cluster's read_committed answers (check). Free of Airflow and Spark."""
