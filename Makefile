# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install idempotently.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-12)

.PHONY: install demo test test-unit readme bench clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	PY=$(PY) VENV=$(VENV) bash scripts/install.sh
	rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: install
	$(BIN)/posttrain demo

# The suite on TEST_WORKERS pytest-xdist workers, a test file to a worker (module fixtures and shared clusters stay
# within a file), each torch at 1 thread so two workers fill two cores without oversubscribing them (the numerics
# matrix's threads1 setting; docs/performance.md has the measurements).
TEST_WORKERS ?= 2
test: install
	POSTTRAIN_TEST_TORCH_THREADS=1 $(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile -v --timeout=1200 \
		--durations=40 --junitxml=runs/test-report.xml

test-unit: install
	$(BIN)/python -m pytest tests -v -m "not integration"

bench: install
	$(BIN)/python benchmarks/perf.py
	$(BIN)/python benchmarks/packing.py
	$(BIN)/python benchmarks/time_to_accuracy.py
	$(BIN)/python benchmarks/step_ratios.py

readme: install
	$(BIN)/python scripts/sync_readme.py

clean:
	rm -rf $(VENV) .venv-verifiers runs .pytest_cache
