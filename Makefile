# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install idempotently.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-12)

.PHONY: install demo test check test-unit readme bench clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	PY=$(PY) VENV=$(VENV) bash scripts/install.sh
	rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: install
	$(BIN)/posttrain demo

# The whole suite, what CI runs. TEST_WORKERS=2 runs it on two pytest-xdist workers, a test file to a worker (module
# fixtures and shared clusters stay within a file), torch at one thread per worker and OpenMP's waiting threads
# asleep (OMP_WAIT_POLICY=PASSIVE). Not the default: on the 2-core AMD EPYC it was tried on, the suite's work is
# mostly compute, the CLI subprocesses that tests start keep 2 torch threads, and the tools demo's run timed out
# beside another file (docs/performance.md#the-test-suites-time).
TEST_WORKERS ?= 1
ifeq ($(TEST_WORKERS),1)
XDIST :=
else
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
export POSTTRAIN_TEST_TORCH_THREADS = 1
export OMP_WAIT_POLICY = PASSIVE
endif
test: install
	$(BIN)/python -m pytest tests $(XDIST) -v --timeout=1200 --durations=40 --junitxml=runs/test-report.xml

# The developers' inner loop (6 minutes after the install on a 2-core AMD EPYC; the aim is 5): the unit tests (config, CLI, docs and architecture
# checks among them), the Ray-actor vLLM engine's weight sync, and a 2-step GRPO run of a fresh tiny model on Ray
# with a vLLM engine through the CLI, as a user runs it. `make test` stays the whole suite, and what CI runs.
CHECK_RUN := runs/check
check: install
	POSTTRAIN_TEST_TORCH_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest tests -n 2 --dist loadfile -q \
		-m "not integration" --timeout=600
	$(BIN)/python -m pytest tests/rollout/test_weight_sync.py -q --timeout=600
	rm -rf $(CHECK_RUN) && $(BIN)/posttrain model tiny $(CHECK_RUN)/model
	$(BIN)/posttrain train examples/addition-grpo.yaml model.path=$(CHECK_RUN)/model runs_dir=$(CHECK_RUN) \
		name=run train.steps=2 algorithm.prompts_per_step=4 task.heldout_size=16 eval.every=0 checkpoint.every=0 \
		alarms.no_signal_steps=0 --quiet
	$(BIN)/python -c "import json; s = json.load(open('$(CHECK_RUN)/run/summary.json')); \
		assert s['steps'] == 2, s; print('check run: 2 GRPO steps on Ray + vLLM, summary ok')"

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
