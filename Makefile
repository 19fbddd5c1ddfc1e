# make test: the whole suite (lint, types, compose schema, the docs site, unit, integration,
# kill and fault trials). make demo: the crash-resume demo. Both create .venv and install on
# first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: install lint typecheck docs test demo trials bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# The docs site (mkdocs.yml, pages in docs/), built with --strict: a broken link, a missing anchor
# or an API reference that does not resolve fails it (not --quiet: strict counts only the
# warnings it is shown). Into site/ unless SITE says otherwise.
# NO_MKDOCS_2_WARNING silences Material's banner on every build (MkDocs 2.0 will not run it; it
# is maintained until May 2027, Zensical is its successor): the pins keep MkDocs 1.x.
SITE ?= site
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(SITE)

test: lint typecheck docs
	$(PY) compose/validate.py compose/compose.yaml
	$(PY) -m pytest -n 3 --dist loadfile

demo: install
	$(PY) -m liyagent demo

# The kill trials, 200 by default, under LIYAGENT_TRIALS_POOL (prefork, or threads), the backlog
# trial at the issue's 36 runs (resumed runs first; reports/resumed-first.json), the tenant
# trials at the issue's 100x flood (reports/tenants.json), then every
# store-fault trial, the partitions `make test` leaves out included (a worker cut from Redis
# only, from Postgres only; as root: network namespaces), their figures and commit written to
# reports/store-faults.json (published as docs/evidence/store-faults.json); then the token-limit
# trials (offered load at twice an endpoint's tokens a minute for 120 s; workers SIGKILLed while
# it is held at its limit), their figures in reports/token-limit.json; then the ledger kill
# trials (every written step's usage against the model server's bills, every lost billed request
# covered by unconfirmed usage; LIYAGENT_LEDGER_TRIALS, 60); then the budget trial (50 runs
# against small budgets with victims SIGKILLed; reports/budgets.json); then the rolling-deploy
# trials (54 runs in flight while every worker is replaced by one of new code, one case per change
# the new code makes; LIYAGENT_DEPLOY_RUNS, LIYAGENT_DEPLOY_CHANGES; reports/rolling-deploys.json).
TOKEN_LIMIT_TRIALS := tests/trials/test_token_limit.py tests/trials/test_token_limit_kills.py
STORE_FAULT_TRIALS := tests/trials/test_fault_trials.py tests/trials/test_redis_failover.py \
	tests/trials/test_postgres_failover.py tests/trials/test_partitions.py
trials: install
	LIYAGENT_KILL_TRIALS=$${LIYAGENT_KILL_TRIALS:-200} LIYAGENT_TRIALS_POOL=$${LIYAGENT_TRIALS_POOL:-prefork} $(PY) -m pytest tests/trials/test_kill_trials.py -q
	LIYAGENT_BACKLOG_RUNS=$${LIYAGENT_BACKLOG_RUNS:-36} LIYAGENT_FIGURES_REPORT=reports/resumed-first.json $(PY) -m pytest tests/trials/test_resumed_first.py -q
	LIYAGENT_TENANT_FLOOD=$${LIYAGENT_TENANT_FLOOD:-100} LIYAGENT_FIGURES_REPORT=reports/tenants.json $(PY) -m pytest tests/trials/test_tenants.py -q
	LIYAGENT_PARTITION_TRIALS=1 LIYAGENT_FIGURES_REPORT=reports/store-faults.json $(PY) -m pytest $(STORE_FAULT_TRIALS) -q
	LIYAGENT_TPM_TRIAL_S=$${LIYAGENT_TPM_TRIAL_S:-120} LIYAGENT_TPM_KILL_TRIALS=$${LIYAGENT_TPM_KILL_TRIALS:-30} LIYAGENT_FIGURES_REPORT=reports/token-limit.json $(PY) -m pytest $(TOKEN_LIMIT_TRIALS) -q
	LIYAGENT_LEDGER_TRIALS=$${LIYAGENT_LEDGER_TRIALS:-60} LIYAGENT_FIGURES_REPORT=reports/ledger.json $(PY) -m pytest tests/trials/test_ledger_trials.py -q
	LIYAGENT_BUDGET_TRIALS=$${LIYAGENT_BUDGET_TRIALS:-50} LIYAGENT_FIGURES_REPORT=reports/budgets.json $(PY) -m pytest tests/trials/test_budget_trials.py -q
	LIYAGENT_DEPLOY_RUNS=$${LIYAGENT_DEPLOY_RUNS:-54} LIYAGENT_DEPLOY_CHANGES=$${LIYAGENT_DEPLOY_CHANGES:-all} LIYAGENT_FIGURES_REPORT=reports/rolling-deploys.json $(PY) -m pytest tests/trials/test_rolling_deploys.py -q
	LIYAGENT_WORKFLOW_TRIALS=$${LIYAGENT_WORKFLOW_TRIALS:-40} LIYAGENT_WORKFLOW_TREES=$${LIYAGENT_WORKFLOW_TREES:-20} LIYAGENT_FIGURES_REPORT=reports/workflows.json $(PY) -m pytest tests/trials/test_workflow_trials.py -q

# Every figure of issue 12 side by side in one run, against the targets: throughput and added
# latency vs plain Celery, server-counted Postgres/Redis work per step, scaling, sweeps at 100k
# running runs, recovery from kill trials, storage (WAL and table sizes per step, a retention
# soak). Private Postgres and Redis, removed at the end; a table per section, one JSON and one
# PNG in reports/bench/. BENCH_ARGS="--quick" or "--only counts" (see `python -m bench --help`).
bench: install
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache reports site
