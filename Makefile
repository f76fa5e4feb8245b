# mbbatch, as a file DAG: results depend on their spec and the sources, figures
# on the results.  Phony targets: help, test, figures, bench, clean.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MBBATCH := $(VENV)/bin/mbbatch
STAMP := $(VENV)/.installed
RESULTS := results
SWEEPS := fig3 fig4 fig8 thm43 servers mb_only static_b dyn_only mb_dynamic controller_step max_wait
# what sweep results depend on: the simulation and theory code, not the figure code
SRC := $(filter-out mbbatch/figures.py,$(wildcard mbbatch/*.py mbbatch/_kernels/*.py mbbatch/theory/*.py))
DONE := $(SWEEPS:%=$(RESULTS)/%.done)

.PHONY: help test figures bench clean

help:
	@echo "make test      create .venv, install mbbatch with its test extras, run the test suite"
	@echo "make figures   run the sweeps in sweeps/ into results/ and draw figures/*.png, *.pdf"
	@echo "make bench     print the speed and memory table"
	@echo "make clean     remove .venv, results/ and caches"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run.py

# A sweep resumes where it stopped; once complete, a newer spec or source
# makes it start over (--overwrite), since its stored cells are then stale.
$(RESULTS)/%.done: sweeps/%.toml $(SRC) | $(STAMP)
	@mkdir -p $(RESULTS)
	@if [ -e $@ ]; then rm -f $@; over=--overwrite; fi; \
	$(MBBATCH) sweep $< --out $(RESULTS)/$*.zarr $$over && touch $@

$(RESULTS)/fig1b.nc: $(SRC) | $(STAMP)
	@mkdir -p $(RESULTS)
	$(MBBATCH) example fig1b --out $@

figures: $(DONE) $(RESULTS)/fig1b.nc
	$(MBBATCH) figures --results $(RESULTS) --out figures

clean:
	rm -rf $(VENV) $(RESULTS) .pytest_cache .hypothesis
	find mbbatch -name __pycache__ -type d -exec rm -rf {} +
