# Two commands for a new user: `make train` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test test-all lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) train.py algo=npq

test: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q

test-all: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q -m "slow or not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check vfl_lightning tests bench train.py
	$(VENV)/bin/ruff format --check vfl_lightning tests bench train.py

bench: $(STAMP)
	$(PY) bench/step_overhead.py

clean:
	rm -rf outputs multirun .pytest_cache
