# oracular-streams. `make help` lists the targets; `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The interpreter that creates .venv (Python 3.11+).
PYTHON_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-done

# The local broker (infra/broker.py). KAFKA_PORT=0 picks free ports; the address is always
# written to $(KAFKA_DIR)/bootstrap.txt.
KAFKA_PORT ?= 9092
KAFKA_DIR ?= var/kafka
BROKER = $(PY) -m infra.broker --dir $(KAFKA_DIR)

# The local three-node cluster (infra/cluster.py): node n on CLUSTER_PORT + 2(n-1), its
# controller on the next port; CLUSTER_PORT=0 picks free ports. The bootstrap list is written
# to $(CLUSTER_DIR)/bootstrap.txt.
CLUSTER_PORT ?= 19092
CLUSTER_DIR ?= var/cluster
CLUSTER = $(PY) -m infra.cluster --dir $(CLUSTER_DIR)

PYTEST_ARGS ?=

.PHONY: help setup kafka broker-up broker-down cluster-up cluster-down topics test test-fast lint typecheck check run \
	bench compiled clean distclean chaos soak

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'

setup: $(SETUP_STAMP) ## create .venv and install the project with its dev tools (quick when done)

# Re-runs only when pyproject.toml changes (or .venv is gone).
$(SETUP_STAMP): pyproject.toml
	@echo "== setup: $(VENV) with $(PYTHON_BOOT); the first time pip installs Faust, aiokafka,"
	@echo "   RocksDB, matplotlib and the dev tools: about 100 s (once; later runs skip this)"
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	set -o pipefail; $(PY) -m pip install --disable-pip-version-check --progress-bar off -e '.[dev]' \
		| { grep --line-buffered -E '^(Collecting|Successfully|ERROR)' || true; }
	@touch $@

kafka: setup ## fetch the Kafka broker jars with Maven into .cache/kafka (once)
	@$(BROKER) fetch >/dev/null

broker-up: kafka ## start the local broker on 127.0.0.1:9092 (KAFKA_PORT=0: free ports); reuse a running one
	@$(BROKER) up --port $(KAFKA_PORT)

broker-down: ## stop the local broker (its topics stay in var/kafka; `make clean` wipes them)
	@if [ -x $(PY) ]; then $(BROKER) down; fi

cluster-up: kafka ## start a local 3-broker KRaft cluster (RF 3, min.insync.replicas=2) on 19092-19097
	@$(CLUSTER) up --port $(CLUSTER_PORT)

cluster-down: ## stop the local 3-broker cluster (its data stays in var/cluster; `make clean` wipes it)
	@if [ -x $(PY) ]; then $(CLUSTER) down; fi

topics: broker-up ## create the product topics on the local broker (idempotent)
	@$(BROKER) topics

test: setup kafka ## all tests, integration included (they start their own broker)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup ## the tests that need no broker
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

# The full chaos runs (tests/chaos, docs/operations.md "Running several workers" and "Running on
# a real cluster"): about five minutes each, one on its own broker (restarted once), one on a
# three-broker cluster (the leader broker killed with SIGKILL and restarted); each run's logs
# kept in var/chaos/<start time>/ (a rerun must not overwrite a failed run's evidence; `make
# clean` deletes them). With them, the faults of the worker's own machine at full size
# (tests/chaos/test_machine_faults_chaos.py, a few minutes: a full disk, corrupt local copies,
# a broker frozen past the session timeout), and a 5-minute schemathesis run against a live
# worker's OpenAPI document (tests/chaos/test_api_fuzz_chaos.py). One of them:
# PYTEST_ARGS=-kfailover (or -k"not failover", -kfull_a).
# Overrides: CHAOS_SECONDS, CHAOS_SEED, CHAOS_WORKERS, CHAOS_EVENTS, CHAOS_INJECT=drop,
# CHAOS_FUZZ_SECONDS.
chaos: setup kafka ## the full chaos runs: workers killed/frozen, broker restart, failover, machine faults, API fuzz
	@mkdir -p var/chaos
	CHAOS_FULL=1 $(PY) -m pytest tests/chaos -m chaos_full \
		-s -p no:cacheprovider \
		--basetemp=var/chaos/$$(date -u +%Y%m%dT%H%M%SZ) $(PYTEST_ARGS)

# One worker for an hour at half its drain rate on the realistic stream, lookups at 50/s, on a
# broker of its own (bench/soak.py): slopes of memory, open files, datadir, lag and lookup p99,
# and every output compared with the replay. SOAK_ARGS="--minutes 20" for a shorter one.
SOAK_ARGS ?=
soak: setup kafka ## one worker for 60 min at half its drain rate: what grows, outputs = replay
	$(PY) -m bench.soak $(SOAK_ARGS)

lint: setup ## ruff check and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup ## mypy: --strict on engine/ and schemas/, normal on streams/ and bench/
	$(VENV)/bin/mypy --strict engine schemas
	$(VENV)/bin/mypy streams bench

check: lint typecheck test ## lint, typecheck and test

run: topics ## the worker on examples/oracular.yaml, fed examples/clickstream.jsonl, outputs tailed
	KAFKA_DIR=$(KAFKA_DIR) VENV=$(VENV) infra/run.sh

bench: setup ## run the benchmarks (python -m bench) if the project has them
	@if $(PY) -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("bench") is None)'; \
		then $(PY) -m bench; else echo "no bench module yet"; fi

# Optional, never the default: engine/ compiled with mypyc into build/compiled/ (the source tree
# and `make test` stay pure Python), then a replay equality check pure vs compiled
# (bench/compiled.py). Run the compiled engine with PYTHONSAFEPATH=1
# PYTHONPATH=build/compiled:. (engine/README.md, "Compiled with mypyc", has the details).
compiled: setup ## mypyc engine/ into build/compiled/ and check its replays match the pure build's
	$(PY) -m bench.compiled build
	$(PY) -m bench.compiled check

clean: broker-down cluster-down ## stop the broker; delete its data, worker state and tool caches
	rm -rf var/ .pytest_cache/ .mypy_cache/ .ruff_cache/ .hypothesis/ build/ dist/ *.egg-info

distclean: clean ## clean, and also delete .venv and the Kafka jars
	rm -rf $(VENV) .cache/
