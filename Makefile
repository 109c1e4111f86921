# Every target creates and uses the project's own virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt
PRESET ?= quickstart
# pytest workers for `make test` (pytest-xdist): one a core, each running torch at cores / workers;
# a module goes to one worker whole, so its module fixtures run once.
TEST_WORKERS ?= auto

.PHONY: run test test-fast test-flower docs bench bench-quick bench-realistic-ci benchmark reproduce reproduce-tests lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e '.[test,flower,trackers]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/clusterfed compare quickstart --out runs/quickstart

test: $(VENV)/.installed-test
	$(BIN)/ruff check clusterfed tests benchmarks
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

# The tests that run no simulation (marker `fast`: maths, scenarios, readers, config,
# clustering, tasks), for the edit-test loop: under a minute on 2 cores.
test-fast: $(VENV)/.installed-test
	$(BIN)/ruff check clusterfed tests benchmarks
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope \
		-m 'fast and not reproduction and not slow and not flower'

$(VENV)/.installed-simulation: $(VENV)/.installed-test
	$(PIP) -e '.[test,flower,simulation]'
	touch $@

# Real SuperLink and SuperNode processes on 127.0.0.1, and Flower's simulation engine (Ray):
# minutes of process starts, so apart.
test-flower: $(VENV)/.installed-simulation
	$(BIN)/python -m pytest -q -m flower

# reference_cfl.py needs the CFL authors' code (CLUSTERFED_CFL_AUTHORS=PATH); it skips without.
bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/round_time.py
	$(BIN)/python benchmarks/executors.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/flower.py
	$(BIN)/python benchmarks/reference_cfl.py $(if $(CLUSTERFED_CFL_AUTHORS),--authors $(CLUSTERFED_CFL_AUTHORS))
	$(BIN)/python benchmarks/vectorised.py
	$(BIN)/python benchmarks/scale.py
	$(BIN)/python benchmarks/lcfl_matrix.py --rows 1
	$(BIN)/python benchmarks/relu_pool.py

# Every clustered method at its defaults, methods x scenarios x seeds (docs/benchmark.md).
# The quick matrix (digits, minutes) exits 1 if a method misses a claim; CI runs it.
bench-quick: $(VENV)/.installed
	$(BIN)/clusterfed benchmark --quick --check --jobs 2 --out runs/benchmark-quick run.threads=1

# The realistic tier's CI slice (docs/benchmark.md): MNIST from $$CLUSTERFED_SHARED_DATA, exits 1
# on a missed claim; without the data it says so and skips.
bench-realistic-ci: $(VENV)/.installed
	@if [ -d "$$CLUSTERFED_SHARED_DATA/mnist/raw" ]; then \
	  $(BIN)/clusterfed benchmark --tier realistic-ci --check --jobs 2 \
	    --out runs/benchmark-realistic-ci --data-dir "$$CLUSTERFED_SHARED_DATA" run.threads=1; \
	else echo "bench-realistic-ci skipped: CLUSTERFED_SHARED_DATA has no mnist/raw"; fi

benchmark: $(VENV)/.installed
	$(BIN)/clusterfed benchmark --out runs/benchmark run.threads=1

reproduce: $(VENV)/.installed
	$(BIN)/clusterfed reproduce $(PRESET) --out runs/reproduce-$(PRESET)

reproduce-tests: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m 'reproduction or slow'

$(VENV)/.installed-docs: $(VENV)/.installed
	$(PIP) -e '.[docs]'
	touch $@

# The documentation site in site/ (docs/, with the method options generated from the code);
# --strict: a broken link or anchor fails the build.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: $(VENV)/.installed-test
	$(BIN)/ruff check clusterfed tests benchmarks

clean:
	rm -rf $(VENV) runs site
