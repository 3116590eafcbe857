"""What Airflow knows of the package as a provider (`airflow providers list`), through the
`apache_airflow_provider` entry point as Airflow's own providers declare theirs. The console is not
listed here: it loads through the `airflow.plugins` entry point, and a plugin listed in both places is
loaded twice (Airflow reports the second as an import error). The Kafka and Postgres connection types
come from Airflow's Kafka and Postgres providers, which the package requires."""

from kafka_batch import installed_version


def get_provider_info() -> dict:
    return {
        "package-name": "kafka-batch",
        "name": "kafka-batch",
        "description": "Exactly-once batches from Kafka offset ranges into PostgreSQL: a DAG and a replay DAG per"
                       " pipeline file, and a console page in the UI's Browse menu.",
        "versions": [installed_version()],
    }
