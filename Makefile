# make test: the whole suite (lint, types, compose schema, unit, integration, kill and fault
# trials). make demo: the crash-resume demo. Both create .venv and install on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: install lint typecheck test demo trials bench clean

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

test: lint typecheck
	$(PY) compose/validate.py compose/compose.yaml
	$(PY) -m pytest

demo: install
	$(PY) -m liyagent demo

trials: install
	LIYAGENT_KILL_TRIALS=$${LIYAGENT_KILL_TRIALS:-200} $(PY) -m pytest tests/unit/test_kill_trials.py -q

# Figures against the design's targets: recovery under kill trials, sweeps at 100k running runs,
# the per-step cost of the fenced statements. Each uses a throwaway database and Redis namespace.
bench: install
	$(PY) bench/kill_trials.py --trials $${LIYAGENT_BENCH_TRIALS:-30}
	$(PY) bench/sweep_scale.py
	$(PY) bench/checkpoint_cost.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache reports
