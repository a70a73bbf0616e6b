# ctrctl: `make demo` runs pipelines/demo.yaml end to end, `make test` runs the tests.
# Both set up .venv first; setup is idempotent and skips pip when pyproject.toml is unchanged.
# For CI: `make pipeline PIPELINE=pipelines/x.yaml [OVERRIDES="k=v ..."]` runs a whole
# pipeline, `make preprocess|plan|train|eval|quantize PIPELINE=...` one step of it (each
# through `ctrctl run --from STEP --until STEP`, so an unchanged step is skipped).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ctrctl-installed
BENCH_STAMP := $(VENV)/.ctrctl-bench-installed
# The CUDA build of fbgemm-gpu where a CUDA driver is present, the CPU build elsewhere.
FBGEMM_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
PYTEST_ARGS ?=
PIPELINE ?= pipelines/demo.yaml
OVERRIDES ?=
RUN_ARGS ?=
STEPS := synth preprocess plan train eval quantize register

.PHONY: setup test test-slow test-all test-pipeline demo pipeline $(STEPS) lint bench bench-setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py ctrctl/data/_fastparse.c ctrctl/modules/_embedding_kernel.c \
		ctrctl/modules/_interaction_kernel.c ctrctl/modules/_interaction_loops.h \
		ctrctl/modules/_dense_kernel.c ctrctl/modules/_dense_loops.h \
		ctrctl/modules/_native_threads.h
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,$(FBGEMM_EXTRA)]"
	$(PY) -c "import ctrctl.compat as c; c.check_versions(strict=True)"
	@touch $(STAMP)

test: setup
	$(PY) -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -m "slow and not gpu" $(PYTEST_ARGS)

# The runner's slow end-to-end tests (what .ci/run adds to `make test`): a killed train step
# resumes, a real `mlflow server`, the registry, `mlflow models serve` of models:/NAME@candidate.
test-pipeline: setup
	$(PY) -m pytest -m "slow and not gpu" tests/runner $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/ctrctl run pipelines/demo.yaml $(RUN_ARGS)

pipeline: setup
	$(VENV)/bin/ctrctl run $(PIPELINE) $(OVERRIDES) $(RUN_ARGS)

$(STEPS): setup
	$(VENV)/bin/ctrctl run $(PIPELINE) $(OVERRIDES) --from $@ --until $@ $(RUN_ARGS)

lint: setup
	$(VENV)/bin/ruff check ctrctl tests scripts
	$(VENV)/bin/mypy ctrctl

# TorchRec is a benchmark reference only: installed without its dependencies so that it
# cannot pull the CUDA build of fbgemm-gpu over the CPU one.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-deps torchrec==1.8.0
	$(PY) -m pip install --quiet tensordict tqdm pyre-extensions iopath pandas
	@touch $(BENCH_STAMP)

bench-setup: $(BENCH_STAMP)

bench: bench-setup
	$(PY) scripts/run_benchmarks.py

clean:
	rm -rf $(VENV) runs/demo .pytest_cache .mypy_cache .ruff_cache
