# mbbatch: `make test`, `make bench`, `make help`.
# The virtual environment is a file target: it is (re)built when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help test bench clean

help:
	@echo "make test    create .venv, install mbbatch with its test extras, run the test suite"
	@echo "make bench   run the benchmarks and print the table"
	@echo "make clean   remove .venv and numba caches"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
	find mbbatch -name __pycache__ -type d -exec rm -rf {} +
