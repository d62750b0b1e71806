# texelflow: every contributor task is a target. `make demo` and `make test` install what is missing.
PYTHON ?= python3
export PYTHON
PYTEST_ARGS ?=
# pytest-xdist: one worker per core; tests sharing a module-scoped fixture stay on one worker
# (tests/conftest.py). PYTEST_JOBS=0 runs everything in this process.
PYTEST_JOBS ?= auto
XDIST = $(if $(filter 0,$(PYTEST_JOBS)),,-n $(PYTEST_JOBS) --dist loadgroup)

.PHONY: setup gen check-gen test test-fast bench demo clean-cache

setup:
	@bash .ci/setup.sh

gen: setup
	$(PYTHON) -m texelflow.cli gen

check-gen: setup
	$(PYTHON) -m texelflow.cli gen --check

test: setup check-gen
	$(PYTHON) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: setup
	$(PYTHON) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

bench: setup
	$(PYTHON) bench/codegen.py
	$(PYTHON) bench/kernels.py
	$(PYTHON) bench/overhead.py
	$(PYTHON) bench/models.py
	$(PYTHON) bench/blocks.py --buffers

demo: setup
	$(PYTHON) -m texelflow.cli demo

clean-cache:
	rm -rf $${TEXELFLOW_CACHE_DIR:-$$HOME/.cache/texelflow}
