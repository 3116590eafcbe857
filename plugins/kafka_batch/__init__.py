"""Exactly-once batches from Kafka offset ranges into PostgreSQL (shared by DAGs, CLI, Spark job and tests)."""


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, at install time)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kafka-batch")
    except PackageNotFoundError:
        return "unknown (the package is not installed: pip install -c constraints.txt -e .)"
