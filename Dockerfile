# Airflow image for docker-compose.yml with the project's pinned dependencies baked in.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/kafka-batch
COPY pyproject.toml constraints.txt ./
COPY plugins ./plugins
RUN pip install --no-cache-dir -c constraints.txt -e . && python -m compileall -q plugins
ENV AIRFLOW_HOME=/opt/airflow PYSPARK_PYTHON=python3
