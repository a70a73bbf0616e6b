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
DOCS_STAMP := $(VENV)/.ctrctl-docs-installed
# The CUDA build of fbgemm-gpu where a CUDA driver is present, the CPU build elsewhere.
FBGEMM_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
PYTEST_ARGS ?=
PIPELINE ?= pipelines/demo.yaml
OVERRIDES ?=
RUN_ARGS ?=
STEPS := synth preprocess plan train eval quantize register

.PHONY: setup test test-nocc test-slow test-all test-pipeline demo continual pipeline $(STEPS) lint bench \
	bench-setup docs docs-setup docs-serve clean

setup: $(STAMP)

NATIVE_SOURCES := $(wildcard ctrctl/modules/native/*.c ctrctl/modules/native/*.h)

$(STAMP): pyproject.toml setup.py ctrctl/data/_fastparse.c $(NATIVE_SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,$(FBGEMM_EXTRA)]"
	$(PY) -c "import ctrctl.compat as c; c.check_versions(strict=True)"
	@touch $(STAMP)

test: setup
	$(PY) -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)

# The fast suite as a machine without a C compiler installs it: a copy of the tree (tracked
# and untracked files, none of the extensions built here) in its own venv, installed with
# CC=/bin/false so that setup.py's optional extensions are skipped; ctrctl then runs its
# library paths (torch, FBGEMM, polars). Fails if any extension got built there.
NOCC_DIR ?= build/nocc
test-nocc:
	rm -rf $(NOCC_DIR) && mkdir -p $(NOCC_DIR)
	git ls-files --cached --others --exclude-standard -z | grep -zv '^$(NOCC_DIR)/' \
		| xargs -0 cp -P --parents -t $(NOCC_DIR)
	cd $(NOCC_DIR) && $(PYTHON) -m venv .venv \
		&& .venv/bin/python -m pip install --quiet --upgrade pip \
		&& CC=/bin/false CXX=/bin/false .venv/bin/python -m pip install --quiet \
			-e ".[dev,$(FBGEMM_EXTRA)]"
	@if ls $(NOCC_DIR)/ctrctl/modules/native/*.so $(NOCC_DIR)/ctrctl/data/*.so 2>/dev/null; \
		then echo "an extension was built with CC=/bin/false" >&2; exit 1; fi
	cd $(NOCC_DIR) && .venv/bin/python -c "from ctrctl.modules import native; print(native.report())"
	cd $(NOCC_DIR) && CC=/bin/false .venv/bin/python -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)

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

# Seven synthetic days, each warm-started from the day before and scored on the next, with
# a full retrain and the frozen day-1 model beside them; report in runs/continual-demo/report.
continual: setup
	$(VENV)/bin/ctrctl run pipelines/continual-demo.yaml $(RUN_ARGS)

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

# The documentation site (mkdocs.yml): the `docs` extra (MkDocs + Material) goes into .venv
# as bench-setup adds TorchRec. The command pages and the YAML reference are regenerated from
# the code (the MkDocs hook runs the same scripts), the performance tables are checked against
# benchmarks/results/, and --strict fails on a broken link or a missing page.
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	@touch $(DOCS_STAMP)

docs-setup: $(DOCS_STAMP)

docs: docs-setup
	$(PY) scripts/gen_cli_docs.py
	$(PY) scripts/gen_config_docs.py
	$(PY) scripts/render_performance.py --check
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve: docs-setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) runs/demo site .pytest_cache .mypy_cache .ruff_cache
