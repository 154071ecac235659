# trajplatform: set-up, demo, server and tests on a fresh Debian 12 machine (Python 3.11).
# `make demo` and `make test` install everything they need (apt packages, virtualenv).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
DEMO_ADMIN ?= admin
DEMO_ADMIN_PASSWORD ?= trajplatform-demo
# Debian packages: what running the platform needs, and what the test suite adds.
APT_RUN := bubblewrap python3-pytest git
# The offline web's documents (manage.py corpus_build debian-docs --from debian; docs/web.md), and
# chromium for the gui scene (docs/gui.md: Playwright drives Debian's /usr/bin/chromium; no browser download).
APT_DEMO := python3.11-doc dict-foldoc dict-jargon chromium
APT_TEST := $(APT_RUN) $(APT_DEMO) postgresql chromium redis
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export FASTMCP_CHECK_FOR_UPDATES := off
export FASTMCP_SHOW_SERVER_BANNER := false
export ADBUTILS_ADB_PATH ?= /bin/false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help install install-test apt-run apt-test apt-demo migrate demo serve worker offline-model test test-sqlite test-postgres test-redis _pytest check lint-imports clean

help:
	@echo "make demo    set up (apt + virtualenv), migrate, create the demo admin, import the example tasks,"
	@echo "             run every scene's examples with the offline model, publish and export a dataset of each"
	@echo "make serve   run the web server (daphne) on http://$(HOST):$(PORT)/ and a worker"
	@echo "make worker  run the django-q2 worker cluster"
	@echo "make offline-model  run the offline scripted-reference model on 127.0.0.1:8765"
	@echo "make test    set up, check the layering (make lint-imports), run the tests without the database"
	@echo "             and SQLite's own on SQLite, every database test on a throwaway PostgreSQL, then the"
	@echo "             production path (PostgreSQL + Redis + several worker clusters); docs/testing.md"

# Install the listed Debian packages that are missing (apt-get update first, as root).
define apt_ensure
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root, or: sudo apt-get install$$missing)" >&2; exit 1; fi; \
	  echo "apt-get install$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

apt-run:
	$(call apt_ensure,$(APT_RUN))

apt-test:
	$(call apt_ensure,$(APT_TEST))

apt-demo:
	$(call apt_ensure,$(APT_DEMO))

# torch first, from the local CPU wheel: an unpinned torch pulls gigabytes of CUDA.
$(VENV)/.installed: requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0+cpu
	$(PY) -m pip install -q -r requirements.lock
	@if $(PY) -m pip list 2>/dev/null | grep -qi '^nvidia-'; then echo "CUDA wheels crept in; check requirements.lock" >&2; exit 1; fi
	@touch $@

# The bundled MCP servers (toucan; docs/mcp.md) apart from the platform's packages, bound read-only
# into the sandbox profile trajplatform-mcp: requirements-mcp.lock without dependencies (they use
# the lock's mcp, pydantic, httpx) into $(MCP_DIR)/python, and the npm servers of
# mcp-npm/package-lock.json into $(MCP_DIR)/node only when npm is present (Debian's npm is not
# installed for them: without it the memory and filesystem servers are left out, loudly).
MCP_DIR := $(VENV)/mcp-packages
$(VENV)/.installed-mcp: $(VENV)/.installed requirements-mcp.lock mcp-npm/package.json mcp-npm/package-lock.json
	rm -rf $(MCP_DIR)
	$(PY) -m pip install -q --no-deps --only-binary=:all: --target $(MCP_DIR)/python -r requirements-mcp.lock
	@if command -v npm >/dev/null && command -v node >/dev/null; then \
	  mkdir -p $(MCP_DIR)/node && cp mcp-npm/package.json mcp-npm/package-lock.json $(MCP_DIR)/node/ && \
	  echo "npm ci (mcp-npm: server-memory, server-filesystem)" && \
	  npm ci --prefix $(MCP_DIR)/node --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null; \
	else echo "WARNING: npm/node not found: the npm MCP servers (memory, filesystem) are NOT installed;" \
	  "their registry records will fail to register (install nodejs and npm, then rm $@ and make install)" >&2; fi
	@touch $@

install: apt-run $(VENV)/.installed $(VENV)/.installed-mcp

# The consumers' own code for the export tests (docs/exports.md): TRL into the virtualenv, and
# LLaMA-Factory without its dependencies into $(VENV)/llamafactory, which only its test puts on
# sys.path (its full install pulls a CUDA torch and older transformers/datasets; it runs on ours).
# PyPI's torchaudio (imported by LLaMA-Factory's data module) is a CUDA build: its compiled
# extension is removed, and torchaudio then imports without it.
$(VENV)/.installed-consumers: $(VENV)/.installed requirements-test-trl.lock requirements-test-llamafactory.lock
	$(PY) -m pip install -q -r requirements-test-trl.lock
	rm -rf $(VENV)/llamafactory
	$(PY) -m pip install -q --no-deps --target $(VENV)/llamafactory -r requirements-test-llamafactory.lock
	rm -f $(VENV)/llamafactory/torchaudio/lib/*.so
	@if $(PY) -m pip list 2>/dev/null | grep -qi '^nvidia-'; then echo "CUDA wheels crept in; check requirements-test-*.lock" >&2; exit 1; fi
	@touch $@

install-test: apt-test $(VENV)/.installed $(VENV)/.installed-mcp $(VENV)/.installed-consumers

migrate: install
	$(PY) manage.py migrate --no-input -v0

demo: apt-demo migrate
	DEMO_ADMIN_PASSWORD='$(DEMO_ADMIN_PASSWORD)' $(PY) manage.py bootstrap_admin $(DEMO_ADMIN) --password-env DEMO_ADMIN_PASSWORD
	$(PY) manage.py import_tasks examples/tasks/demo.jsonl --batch demo --once
	$(PY) manage.py synthesize --tasks examples/tasks/code_exec.jsonl --batch demo-rollouts --once --wait --start-offline-model
	$(PY) manage.py import_envscaler --metadata examples/envscaler/metadata.json --scenarios examples/envscaler/scenarios.json --batch demo-envscaler --once --wait --start-offline-model
	@# the bundled MCP servers, each snapshotted in a sandbox (the npm ones only where npm installed them)
	$(PY) manage.py mcp_register examples/toucan/servers.json
	@if [ -d $(MCP_DIR)/node/node_modules ]; then $(PY) manage.py mcp_register examples/toucan/servers-npm.json; \
	else echo "WARNING: npm MCP servers not installed: examples/toucan/servers-npm.json not registered" >&2; fi
	@# toucan: the ready tasks on the bundled servers, then a small batch generated by the toucan pipeline
	@# (questions, dedup against earlier ones, quality check) and rolled out (docs/toucan.md)
	$(PY) manage.py synthesize --tasks examples/tasks/toucan.jsonl --batch demo-toucan --once --wait --start-offline-model
	$(PY) manage.py synthesize_pipeline toucan --seeds examples/toucan/seeds.jsonl --batch demo-toucan-generated --wait --start-offline-model
	@# toolace (docs/toolace.md): tool suites synthesized with their code and gated in the sandbox, tasks admitted
	@# by replaying their calls, agent and mt dialogues with a simulated user (two wrong on purpose: reward 0)
	$(PY) manage.py synthesize_pipeline toolace --seeds examples/toolace/seeds.jsonl --batch demo-toolace --wait --start-offline-model
	@# the offline web (docs/web.md): FOLDOC, the Jargon File and the Python docs in one BM25 index
	$(PY) manage.py corpus_build debian-docs --from debian
	@# deep_search (docs/web.md): multi-hop questions over that corpus, graded by exact match with cited pages
	@# checked against the pages opened (one answered wrongly on purpose: reward 0)
	$(PY) manage.py synthesize --tasks examples/tasks/deep_search.jsonl --batch demo-deep-search --once --wait --start-offline-model
	@# search2qa (docs/search2qa.md): QA pairs explored, evolved, checked and solved by deep_search
	@# episodes over that corpus; each pair becomes a deep_search task in demo-search2qa-qa with its solver run
	$(PY) manage.py synthesize --tasks examples/search2qa/tasks.jsonl --batch demo-search2qa --once --wait --start-offline-model --solutions examples/search2qa
	@# multi_agent (docs/multi_agent.md): planner + coder + tester, and a round-robin group, over code_exec's
	@# sandbox; each role a sub-episode stored as a child trajectory; code_exec's pytest gives the shared reward
	$(PY) manage.py synthesize --tasks examples/tasks/multi_agent.jsonl --batch demo-multi-agent --once --wait --start-offline-model --solutions examples/tasks/multi_agent.jsonl examples/multi_agent/roles.jsonl
	@# mobile_agent (docs/mobile_agent.md): 13 tasks on the simulated Android device (labelled as such), state-checked
	$(PY) manage.py synthesize --tasks examples/tasks/mobile_agent.jsonl --batch demo-mobile --once --wait --start-offline-model
	@# gui (docs/gui.md): 11 MiniWoB++ pages and the bundled shop, mail and admin sites in chromium in the sandbox,
	@# rewards from the pages' own state (one solved wrongly on purpose: reward 0); screenshots in the console
	$(PY) manage.py synthesize --tasks examples/tasks/gui.jsonl --batch demo-gui --once --wait --start-offline-model
	@# a published dataset version from the code rollouts, and one export of it (once)
	$(PY) manage.py dataset_stats demo-code >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-code --batch demo-rollouts --min-score 80 --success-only --publish --no-progress
	@mkdir -p var/exports
	$(PY) manage.py dataset_export demo-code --version 1 --format sft-trl --out var/exports/demo-code-v1.sft-trl.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-toucan >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-toucan --batch demo-toucan-generated --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-toucan --version 1 --format toucan --out var/exports/demo-toucan-v1.toucan.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-toolace >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-toolace --batch demo-toolace --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-toolace --version 1 --format toolace --out var/exports/demo-toolace-v1.toolace.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-qa >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-qa --batch demo-search2qa-qa --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-qa --version 1 --format qa --out var/exports/demo-qa-v1.qa.jsonl --force --no-progress
	$(PY) manage.py dataset_export demo-qa --version 1 --format qa-verl --out var/exports/demo-qa-v1.qa-verl.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-deep-search >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-deep-search --batch demo-deep-search --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-deep-search --version 1 --format sft-trl --out var/exports/demo-deep-search-v1.sft-trl.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-multi-agent >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-multi-agent --batch demo-multi-agent --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-multi-agent --version 1 --format multiagent-agentjet --out var/exports/demo-multi-agent-v1.multiagent-agentjet.jsonl --force --no-progress
	$(PY) manage.py dataset_export demo-multi-agent --version 1 --format sft-trl --out var/exports/demo-multi-agent-v1.sft-trl.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-mobile >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-mobile --batch demo-mobile --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-mobile --version 1 --format aitw --out var/exports/demo-mobile-v1.aitw.jsonl --force --no-progress
	$(PY) manage.py dataset_export demo-mobile --version 1 --format sharegpt-vision --out var/exports/demo-mobile-v1.sharegpt-vision.jsonl --force --no-progress
	$(PY) manage.py dataset_stats demo-gui >/dev/null 2>&1 || \
	  $(PY) manage.py dataset_create demo-gui --batch demo-gui --success-only --publish --no-progress
	$(PY) manage.py dataset_export demo-gui --version 1 --format sharegpt-vision --out var/exports/demo-gui-v1.sharegpt-vision.jsonl --force --no-progress
	$(PY) manage.py dataset_export demo-gui --version 1 --format trl-vision --out var/exports/demo-gui-v1.trl-vision.jsonl --force --no-progress
	$(PY) manage.py dataset_export demo-gui --version 1 --format sft-openai-vision --out var/exports/demo-gui-v1.sft-openai-vision.jsonl --force --no-progress
	@echo
	@echo "Demo ready. Start the server with 'make serve', then open http://$(HOST):$(PORT)/admin/"
	@echo "and log in as '$(DEMO_ADMIN)' / '$(DEMO_ADMIN_PASSWORD)'. Under Tasks > Batches: 'demo' (the example"
	@echo "tasks of every scene, imported and not started: its Start action queues them for the worker),"
	@echo "'demo-rollouts' (24 code tasks run by the offline scripted-reference"
	@echo "model in the local sandbox, then reviewed), 'demo-envscaler' (15 MCP environment tasks),"
	@echo "'demo-toucan' (12 tasks on real MCP servers) and 'demo-toucan-generated' (questions the toucan"
	@echo "pipeline generated, deduplicated and checked; its stage runs under Engines > Pipeline runs)."
	@echo "'demo-deep-search' (10 research questions over the offline web: rewards by exact match and sources),"
	@echo "'demo-search2qa' (the search2qa factory: 3 verified QA pairs and one dropped as too easy) and"
	@echo "'demo-search2qa-qa' (the deep_search tasks it emitted, each with its executed solver run)."
	@echo "'demo-toolace' (14 tasks the toolace pipeline admitted by execution, one across two suites: agent and mt dialogues with clarification turns;"
	@echo "its suites and gate verdicts under Engines > Pipeline runs; two wrong solutions score 0; dataset 'demo-toolace' in ToolACE's format)."
	@echo "'demo-multi-agent' (6 team tasks on code_exec and deep_search: each role's run is a child trajectory; ma-004 scores 0)."
	@echo "'demo-mobile' (13 mobile_agent tasks on the simulated Android device: screenshots, device-state checks; one wrong answer scores 0)."
	@echo "'demo-gui' (15 gui tasks in chromium in the sandbox: MiniWoB++ pages and the bundled shop, mail and admin sites;"
	@echo "rewards from the pages' own state, screenshots with the action drawn in the trajectory viewer; one wrong solution scores 0)."
	@echo "Review console: http://$(HOST):$(PORT)/review/  trajectories: http://$(HOST):$(PORT)/trajectories/"
	@echo "Datasets (published v1 of each, exports in var/exports/): 'demo-code' (sft-trl), 'demo-toucan' (Toucan's rows),"
	@echo "'demo-toolace' (ToolACE's format), 'demo-qa' (qa, qa-verl), 'demo-deep-search' (sft-trl), 'demo-multi-agent'"
	@echo "(multiagent-agentjet, sft-trl), 'demo-mobile' (aitw, sharegpt-vision), 'demo-gui' (sharegpt-vision, trl-vision,"
	@echo "sft-openai-vision): http://$(HOST):$(PORT)/datasets/"

# The web server (daphne) in the foreground and one django-q2 worker cluster beside it;
# Ctrl-C stops both.
# With no LLM configured it also serves the offline scripted model (a labelled stand-in).
serve: migrate
	$(PY) manage.py collectstatic --no-input -v0
	@set -m; pids=""; \
	if [ -z "$$LLM_BASE_URL$$LLM_API_KEY$$LLM_PROVIDERS" ]; then \
	  $(PY) manage.py offline_model & pids="$$pids $$!"; fi; \
	$(PY) manage.py qcluster & pids="$$pids $$!"; \
	trap 'kill -TERM $$pids 2>/dev/null; wait $$pids 2>/dev/null' EXIT INT TERM; \
	$(VENV)/bin/daphne -b $(HOST) -p $(PORT) trajplatform.asgi:application

worker: migrate
	$(PY) manage.py qcluster

offline-model: install
	$(PY) manage.py offline_model

check: install
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run

# Each pass is bounded as a whole (TEST_PASS_TIMEOUT seconds; each test by pytest-timeout too,
# pyproject.toml): on expiry pytest gets SIGINT (it tears down and prints where it was), SIGKILL
# 60 s later, and the pass fails saying so. TEST_WORKERS: pytest-xdist worker processes (0: none):
# 2 in the SQLite and PostgreSQL passes, none in the production pass and in `make _pytest` unless given.
TEST_PASS_TIMEOUT ?= 1800
TEST_WORKERS ?= 0
PASS_WORKERS := 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)
TEST_PASS ?= pytest

test: install-test
	@t0=$$(date +%s); times=$$(mktemp); export TEST_TIMES=$$times; \
	$(MAKE) --no-print-directory lint-imports && \
	$(MAKE) --no-print-directory test-sqlite && \
	$(MAKE) --no-print-directory test-postgres && \
	$(MAKE) --no-print-directory test-redis; rc=$$?; \
	cat $$times; rm -f $$times; \
	echo "make test: the three passes took $$(( $$(date +%s) - t0 )) s (exit $$rc)"; exit $$rc

# pytest exit 5 means no test ran: that is a failure here, not a pass. Each pass prints its
# duration (and adds it to $$TEST_TIMES, which `make test` lists at the end).
define run_pytest
	@set +e; t0=$$(date +%s); \
	timeout --foreground -s INT -k 60 $(TEST_PASS_TIMEOUT) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 124 ] || [ $$rc -eq 137 ]; then \
	  echo "the $(TEST_PASS) pass ran longer than TEST_PASS_TIMEOUT=$(TEST_PASS_TIMEOUT) s and was stopped" >&2; rc=1; fi; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; rc=1; fi; \
	echo "$(TEST_PASS) pass: $$(( $$(date +%s) - t0 )) s (exit $$rc)" | tee -a "$${TEST_TIMES:-/dev/null}"; exit $$rc
endef

test-sqlite: TEST_PASS = sqlite
test-sqlite test-postgres: TEST_WORKERS = $(PASS_WORKERS)
# The SQLite pass: every test that does not touch the database (they run once, here), and the
# database tests where the embedded default's own behaviour is at stake (tests/conftest.py
# SQLITE_PASS: the rollout worker and tasks, audit triggers, migrations, the demo path).
test-sqlite:
	@echo "== tests without the database, and SQLite's own =="
	$(MAKE) --no-print-directory _pytest TEST_PASS=sqlite TEST_WORKERS=$(TEST_WORKERS) \
	  PYTEST_ARGS='-m "not db or sqlite" $(PYTEST_ARGS)'

# Every test that touches the database carries the `db` marker (tests/conftest.py adds it; a test
# holding database access without it fails): the PostgreSQL pass runs every one of them.
test-postgres:
	@echo "== test suite on PostgreSQL (every test marked db) =="
	tests/tools/with-postgres $(MAKE) --no-print-directory _pytest TEST_PASS=postgres TEST_WORKERS=$(TEST_WORKERS) \
	  PYTEST_ARGS="-m db $(PYTEST_ARGS)"

# The production path (docs/production.md): a throwaway PostgreSQL and Redis, django-q2's Redis
# broker, channels-redis, the caches in Redis; tests/production starts real worker clusters.
# Besides it, the files of the queue, rollout, reaper, live-log, webhook, throttle and cache tests
# that do not assert the embedded broker's or in-memory layer's own internals.
REDIS_TESTS := tests/production tests/tasks/test_livelog.py tests/tasks/test_live_log_browser.py \
	tests/api/test_webhooks.py tests/api/test_errors.py tests/engines/test_llm.py
test-redis:
	@echo "== production path: PostgreSQL + Redis =="
	tests/tools/with-postgres tests/tools/with-redis $(MAKE) --no-print-directory _pytest TEST_PASS=redis \
	  TEST_WORKERS=0 PYTEST_ARGS="$(REDIS_TESTS) $(PYTEST_ARGS)"

_pytest:
	$(call run_pytest)

# The layering contracts of .importlinter (issue 37): no module cycle, the engine core imports no app,
# the apps' domain modules import downward only, the pages above them all.
lint-imports: $(VENV)/.installed
	PYTHONPATH=. $(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf var/static var/test_db_*.sqlite3*
