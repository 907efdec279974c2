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

test: install
	$(BIN)/python -m pytest tests -v --timeout=1200 --durations=40 --junitxml=runs/test-report.xml

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
