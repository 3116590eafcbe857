# Two commands matter: `make demo` (end to end on embedded services) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# spark-submit finds SPARK_HOME through the python3 on PATH: keep the venv first.
export PATH := $(abspath $(BIN)):$(PATH)
# Where the local services keep their data, logs and env.sh; every target below honours it.
export KAFKA_BATCH_HOME ?= $(CURDIR)/.local
WITH_ENV := source "$(KAFKA_BATCH_HOME)/env.sh" &&

.PHONY: install up airflow down demo demo-customers test test-quickstart test-browser test-unit lint bench chaos lock clean chromium schema

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[local,test]'
	@touch $@

# Apache Kafka's broker (tools/kafka_batch_dev/kafka_broker.py pins its version) comes from Maven Central
# through Maven, or pyspark's Ivy where Maven is missing, into $(KAFKA_BATCH_HOME)/kafka-<version>/libs.
# The project's own bytecode, as pip compiles an installed wheel's (an editable install is not): a command
# then never compiles its modules, where PYTHONDONTWRITEBYTECODE or a read-only checkout keeps Python
# from caching them (0.1 s of every command). Stale files are ignored by Python, and refreshed here.
install: $(STAMP)
	@$(BIN)/python -m compileall -q plugins tools spark_jobs dags >/dev/null
	@$(BIN)/kafka-batch local install >/dev/null  # Apache Kafka's broker and Spark's Kafka connectors, once

# KAFKA_NODES=3: Apache Kafka as a replicated cluster of three KRaft nodes (one by default).
# KAFKA_SECURITY=sasl_ssl: its listener SASL_SSL (SCRAM-SHA-512, a local CA) with ACLs (PLAINTEXT by default).
KAFKA_NODES ?=
KAFKA_SECURITY ?=
LOCAL_UP := $(BIN)/kafka-batch local up $(if $(KAFKA_NODES),--kafka-nodes $(KAFKA_NODES)) \
	$(if $(KAFKA_SECURITY),--kafka-security $(KAFKA_SECURITY))

up: install
	$(LOCAL_UP)

# The Airflow UI with the console page, on loopback: api-server, scheduler, dag-processor, triggerer.
airflow: install
	$(LOCAL_UP) --airflow

down:
	@if [ -x $(BIN)/kafka-batch ]; then $(BIN)/kafka-batch local down; fi

demo: up
	$(WITH_ENV) $(BIN)/python scripts/demo.py

# The upsert sink's samples: a keyed topic and Debezium change events mirrored, rewound and run again.
demo-customers: up
	$(WITH_ENV) $(BIN)/python scripts/demo_customers.py

# The browser tests drive Debian's Chromium (Playwright cannot download its own browser here).
CHROMIUM ?= /usr/bin/chromium

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else echo "Chromium missing at $(CHROMIUM): sudo apt-get install -y chromium (the browser tests need it)"; fi; \
	fi

# Three pytest-xdist workers share one set of services on two cores (many tests wait on a broker, a
# scheduler or a failover more than they compute); a test file stays on one worker, and the tests that run
# DAGs (tests/airflow) share one (tests/conftest.py).
TEST_WORKERS ?= 3

test: install chromium
	$(BIN)/ruff check .
	$(BIN)/pytest -n $(TEST_WORKERS) --durations=15 tests  # ends with the 15 slowest tests

# The README's quick start (`make demo` as written, then `make down`) on a local home of its own; CI runs it
# after `make test`.
test-quickstart: install
	$(BIN)/pytest -m quickstart tests/quickstart

test-browser: install chromium
	$(BIN)/pytest -m browser tests

test-unit: install
	$(BIN)/pytest tests/unit

lint: install
	$(BIN)/ruff check .

$(VENV)/.bench: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[local,test,bench]'
	@touch $@

bench: install $(VENV)/.bench
	$(BIN)/kafka-batch local up
	$(WITH_ENV) $(BIN)/python scripts/bench $(BENCH_ARGS)

# Fault injection against ground truth: CHAOS_ARGS="--iterations 20 --records 10000" for a full run.
# Strikes go through spark-submit; the fault-free recovery after each runs on the Spark Connect server.
# Then the soak: producers, batches of a JSON and an Avro pipeline and a fault every 15 s, for 5 minutes.
# On three nodes (`make chaos KAFKA_NODES=3`, or a local home made so) also the node kills.
SOAK_SECONDS ?= 300
# Then the long fault scenarios of the tests (marker long_fault: node kills on a three-node cluster), which
# `make test` leaves to this target, keeping a short representative of each.
chaos: install
	$(LOCAL_UP)
	$(WITH_ENV) $(BIN)/python scripts/chaos.py --recover-on spark-connect --soak $(SOAK_SECONDS) $(CHAOS_ARGS)
	$(BIN)/pytest -n $(TEST_WORKERS) -m long_fault tests

# The pipeline definition's JSON Schema (editors) and reference, written from the typed model, and the
# command line's reference, written from its parser; a test fails while any is stale.
schema: install
	$(BIN)/kafka-batch schema > pipelines/pipeline.schema.json
	$(BIN)/kafka-batch schema --markdown > docs/configuration.md
	$(BIN)/kafka-batch schema --commands > docs/cli.md

lock: install
	$(BIN)/pip freeze --all --exclude-editable | grep -v '^-e\|^pip==' | sed '1i # Every dependency pinned (Airflow constraints files cannot be fetched here). Regenerate with `make lock`.' > constraints.txt

clean: down
	rm -rf "$(KAFKA_BATCH_HOME)"
