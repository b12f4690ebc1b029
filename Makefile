# servestack: `make local` runs the whole local topology, `make test` runs every check.
# Both set up .venv (uv, from uv.lock) and node_modules (npm ci, from package-lock.json) when missing.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
UV := .tools/bin/uv
UV_VERSION := 0.13.8
CDK := node_modules/.bin/cdk

export UV_PYTHON ?= python3
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true
# Python caches compiled bytecode (__pycache__, git-ignored) even where the shell sets PYTHONDONTWRITEBYTECODE, as
# this machine's does: without the cache, each of the suite's hundreds of Python processes (local up and its
# children, the CLI, the CDK app) compiles botocore, moto, numpy's Python and the rest from source again, which
# was half of pytest's collection time and over a third of a local up's start-up CPU.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup local test lint typecheck docs pytest synth bench bench-peers models requirements clean test-localstack

help:
	@echo "make local   set up, then run the whole local topology (servestack local up)"
	@echo "make test    set up, then run ruff, mypy and every test"
	@echo "make docs    build the docs site (mkdocs.yml, docs/) into site/ with --strict: a broken link or anchor, or a page"
	@echo "            outside the nav, fails it; .venv/bin/mkdocs serve shows it while you edit"
	@echo "make synth   synthesize the CDK app into cdk.out (offline)"
	@echo "make bench   print benchmark figures: realtime, capture, Lambda cold start, batch, async (needs wrk)"
	@echo "make bench-peers  ours against MLServer on the same models, in interleaved pairs (needs wrk; installs"
	@echo "            MLServer into .bench/peers once; not part of make test nor make bench)"
	@echo "make models  rebuild the bundled model artifacts"
	@echo "make requirements  write the locked runtime that bundles and images install (from uv.lock)"
	@echo "make test-localstack  S3/SQS integration tests on LocalStack in host mode (not part of make test)"

$(UV):
	python3 -m venv .tools
	.tools/bin/pip install -q uv==$(UV_VERSION)

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen
	touch $@

node_modules/.synced: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.synced node_modules/.synced

local: setup
	$(VENV)/bin/servestack local up

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# --strict: a warning (a broken link or anchor, a page left out of the nav) fails the build. The Material theme
# fetches nothing at build time (mkdocs.yml sets font: false), so this runs offline.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# Three workers on this 2-core machine: a good part of the suite waits on real servers, local up children and
# schedules, and a third worker fills those waits (6.1 min against 7.6 with two when it was measured; the whole
# `make test` now takes 5-6 min here; tests/conftest.py says how the modules are spread). PYTEST_WORKERS=0 runs it
# in one process.
PYTEST_WORKERS ?= 3
pytest: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=25

test: lint typecheck docs pytest

test-localstack: setup
	localstack/run-host.sh

# cdk.json's app is `python3 app.py`, as `cdk init` writes it: the CLI runs it with the virtual environment first
# on PATH, as an activated one would be.
synth: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" $(CDK) synth --no-notices --quiet

bench: setup
	$(PY) -m bench.realtime
	$(PY) -m bench.realtime --only capture
	$(PY) -m bench.servers
	$(PY) -m bench.multi_model
	$(PY) -m bench.cold_start
	$(PY) -m bench.batch_job --rows 1000000
	$(PY) -m bench.batch_job --rows 1000000 --input-format parquet --output-format parquet --chunk-rows 50000
	$(PY) -m bench.async_jobs --jobs 1000 --poison 20
	$(PY) -m bench.images
	$(PY) -m bench.images --model resnet18

# The peers bench: MLServer in an environment of its own (.bench/peers, every version pinned in
# bench/peers-requirements.txt), rebuilt only when that file changes.
PEERS := .bench/peers
$(PEERS)/.synced: bench/peers-requirements.txt | $(UV)
	$(UV) venv -q --allow-existing $(PEERS)
	$(UV) pip sync -q --python $(PEERS)/bin/python bench/peers-requirements.txt
	touch $@

bench-peers: setup $(PEERS)/.synced
	$(PY) -m bench.peers --mlserver $(PEERS)/bin/mlserver

models: setup
	$(PY) -m servestack.sample_models

# The locked runtime that Lambda bundles and images install, shipped inside the package so that synth reads no
# lock file of a project: the `runtime` extra for Lambda, plus the HTTP servers, boto3 and pyarrow for the images;
# the GPU image takes onnxruntime-gpu of the very version the CPU image runs. tests/unit/test_requirements.py
# keeps them equal to uv.lock.
REQUIREMENTS_DIR ?= servestack/cdk/requirements
EXPORT = $(UV) export --frozen --no-dev --no-emit-project --no-hashes --no-header --no-annotate --format requirements-txt
requirements: $(UV)
	$(EXPORT) --extra runtime > $(REQUIREMENTS_DIR)/lambda.txt
	$(EXPORT) --extra server --extra aws --extra parquet > $(REQUIREMENTS_DIR)/image-cpu.txt
	sed 's/^onnxruntime==/onnxruntime-gpu==/' $(REQUIREMENTS_DIR)/image-cpu.txt > $(REQUIREMENTS_DIR)/image-gpu.txt

clean:
	rm -rf cdk.out site .pytest_cache .mypy_cache .ruff_cache
