# Airflow image for docker-compose.yml: kafka-batch installed from its wheel, with the project's pinned
# dependencies (constraints.txt), as a team adds it to its own Airflow image. The checkout is not on the
# image's Python path: Airflow loads the console and the provider through the package's entry points,
# and the DAG folder needs only the short file of dags/.
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps -w /dist .

FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
COPY constraints.txt /tmp/constraints.txt
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install --no-cache-dir -c /tmp/constraints.txt /tmp/dist/kafka_batch-*.whl && rm -rf /tmp/dist
ENV AIRFLOW_HOME=/opt/airflow PYSPARK_PYTHON=python3
