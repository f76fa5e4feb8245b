# mbbatch, as a file DAG: results depend on their specs and the sources,
# figures on the results.  Phony targets: help, install, test, thorough, fuzz, figures, docs, bench, clean.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MBBATCH := $(VENV)/bin/mbbatch
STAMP := $(VENV)/.installed
RESULTS := results
# matplotlib's font cache, per checkout: a cache shared with another install can point its
# fonts elsewhere (or at the system's copies), and the figures' bytes then differ
export MPLCONFIGDIR := $(CURDIR)/$(VENV)/mplconfig
# where specs that replay a trace look for it (beside them, then here): data/ in the
# checkout, else shared/data beside it (where the tests look too); unset, such specs are
# skipped with a note and their committed figures stay
MBBATCH_DATA ?= $(firstword $(wildcard $(CURDIR)/data $(abspath $(CURDIR)/../shared/data)))
# byte-code is written even where the environment turns writing it off: a test run, a sweep's
# pool, the figures' workers start many Python processes, which share the compiled modules in
# __pycache__ instead of compiling every module from its source again in each (0.6 s a process).
# The install leaves the compiling to the first import (pip --no-compile: half the install's time,
# most of it spent on modules nothing imports)
export PYTHONDONTWRITEBYTECODE :=
SPECS := $(wildcard sweeps/*.toml)
# what sweep results depend on: the simulation, sweep and theory code, not the figure code
SRC := $(wildcard mbbatch/*.py mbbatch/_kernels/*.py mbbatch/service_models/*.py mbbatch/theory/*.py mbbatch/sweeps/*.py)
SWEPT := $(RESULTS)/.swept

.PHONY: help install test thorough fuzz figures docs bench clean FORCE

help:
	@echo "make install   create .venv and install mbbatch with its test, bench and docs extras"
	@echo "make test      create .venv, install mbbatch with its extras, run the linter and the test suite"
	@echo "make thorough  the heavy checks, and the hypothesis properties on 500 fresh random examples each"
	@echo "make figures   run the sweeps in sweeps/ into results/ and draw figures/*.png, *.pdf"
	@echo "make fuzz      random sweep specs run serially, on a pool, killed and resumed, on dask, by the CLI"
	@echo "make docs      run the documentation's examples (doctest), then build the HTML site into docs/_build/html"
	@echo "make bench     print the speed and memory table, and the event kernel's before/after pairs"
	@echo "make clean     remove .venv, results/, the built documentation and caches"

# mbbatch is installed editable in strict mode: build/ holds links to the package's files, and only
# they are on the path (in the default mode a folder named mbbatch beside a script, as a clone is,
# shadows the package as an empty namespace package).  A file added to or removed from the package
# needs the install again: the install depends on their list, rewritten only when it changes.
MODULES := $(VENV)/.modules
$(MODULES): FORCE
	@mkdir -p $(VENV)
	@find mbbatch -type f ! -path '*/__pycache__/*' | LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

$(STAMP): pyproject.toml $(MODULES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[test,bench,docs]' --config-settings editable_mode=strict
	touch $(STAMP)

# the environment alone: .venv with mbbatch (editable) and its test, bench and docs extras
install: $(STAMP)

# the linter first (ruff, configured in pyproject.toml), then one test worker per core; a test
# file's tests share a worker (and its session fixtures); the checks marked heavy (processes
# killed and raced, every figure drawn twice, the kernels' disk cache recompiled, the HTML site
# built) run in thorough; the 20 slowest tests are listed at the end (the suite's budget: 8 minutes on a
# fresh clone, numba's compiling included); a test running past 10 minutes fails (a hang would
# otherwise hold the suite until its caller gives up)
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n auto --dist loadfile -m "not heavy" --durations=20 --timeout=600

# the checks marked heavy, then the hypothesis properties under tests/conftest.py's "thorough"
# profile: 500 random examples each, fresh every run (make test's are few and fixed, so every
# run repeats one experiment)
thorough: $(STAMP)
	$(PY) -m pytest -n auto --dist loadfile -m heavy
	HYPOTHESIS_PROFILE=thorough $(PY) -m pytest -n auto --dist loadfile $(shell grep -l '@given' tests/test_*.py)

# random sweep specs (tests/fuzz_sweeps.py): each refused before a store exists, or run
# and compared bit for bit across executors, and mutated with junk values; FUZZ_SPECS and
# FUZZ_SEED choose how many and which
FUZZ_SPECS ?= 100
FUZZ_SEED ?= 0
fuzz: $(STAMP)
	$(PY) -m tests.fuzz_sweeps --specs $(FUZZ_SPECS) --seed $(FUZZ_SEED)

# the paired before/after table runs against this commit (any git revision): the last before the
# iteration cost was declared once and the continuous engine paid a real server's overheads
# (BENCH_BEFORE=3171bff: before the event kernel's formation and routing steps were named, a version
# without profiles, so without the measured cases)
BENCH_BEFORE ?= 98cfe0b
# (a kernel compiled in a process that loads the kernels it calls from the numba cache calls them where one
# compiled beside them inlines them: a cluster's engine resumed in 170 ns, not 64, after an edit to the driver's
# module alone.  So the bench runs on caches all compiled from the same kernel sources: when they change, the
# caches mbbatch wrote under mbbatch/ are removed first, and the bench's first runs compile every kernel afresh)
KERNEL_SOURCES := $(wildcard mbbatch/_kernels/*.py)
KERNEL_STAMP := mbbatch/_kernels/__pycache__/sources.sha256

bench: $(STAMP)
	@sum=$$(cat $(KERNEL_SOURCES) | sha256sum | cut -d' ' -f1); \
	if [ "$$(cat $(KERNEL_STAMP) 2>/dev/null)" != "$$sum" ]; then \
		echo "the kernels' sources changed: their numba caches compiled afresh"; \
		find mbbatch -path '*/__pycache__/*' \( -name '*.nbi' -o -name '*.nbc' \) -delete; \
		mkdir -p $(dir $(KERNEL_STAMP)); echo "$$sum" > $(KERNEL_STAMP); \
	fi
	$(PY) bench/run.py
	$(PY) bench/paired.py --before $(BENCH_BEFORE)

# Every spec in one process, on one pool of workers.  A sweep resumes where it
# stopped; a store made from another spec or by other code is stale, and is
# discarded and recomputed (--rebuild-stale deletes only sweep stores).
$(SWEPT): $(SPECS) $(SRC) | $(STAMP)
	@mkdir -p $(RESULTS)
	MBBATCH_DATA="$(MBBATCH_DATA)" $(MBBATCH) sweep $(SPECS) --out-dir $(RESULTS) --rebuild-stale --skip-missing-traces
	@touch $@

# both examples in one process (grouped targets: one run makes both files)
$(RESULTS)/fig1b.nc $(RESULTS)/engine_event.nc &: $(SRC) | $(STAMP)
	@mkdir -p $(RESULTS)
	$(MBBATCH) example fig1b engine_event --out-dir $(RESULTS)

figures: $(SWEPT) $(RESULTS)/fig1b.nc $(RESULTS)/engine_event.nc
	$(MBBATCH) figures --results $(RESULTS) --out figures
	$(MBBATCH) validate --data "$(MBBATCH_DATA)" --figure figures/validation.png

# the documentation: its examples first (doctest: a number the pages quote is one the code
# returns), then the HTML site; a warning is an error.  The autosummary stubs and the
# parameter and metric tables are written into docs/api/generated/ (not committed).
DOCS_BUILD := docs/_build
# (MBBATCH_DOCS_FULL: the accuracy page's examples that validate the measured APEX runs, 5 minutes, run
# here; make test's build of the examples skips them, and its heavy tests check the numbers the page quotes)
docs: $(STAMP)
	MBBATCH_DOCS_FULL=1 $(PY) -m sphinx -W --keep-going -j 1 -b doctest docs $(DOCS_BUILD)/doctest
	$(PY) -m sphinx -W --keep-going -j 1 -b html docs $(DOCS_BUILD)/html
	@echo "open $(DOCS_BUILD)/html/index.html"

clean:
	rm -rf $(VENV) build $(RESULTS) .pytest_cache .hypothesis $(DOCS_BUILD) docs/api/generated
	find mbbatch -name __pycache__ -type d -exec rm -rf {} +
