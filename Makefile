# layerlab: `make demo` runs the demo sweep on the embedded stack; `make test` runs the tests.
# Both install what they need into .venv first (about 4 minutes the first time).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
LAYERLAB := $(VENV)/bin/layerlab
STAMP := $(VENV)/.installed
# pytest-xdist processes for make test: the stack tests (Ray, servers) run in one, in order, and every other
# module beside them (tests/conftest.py groups them); on 2 cores a third process only adds contention.
TEST_PROCESSES ?= 2

# Quiet, offline-safe defaults for Ray, MLflow and Hugging Face (stack-notes: pitfalls).
export RAY_USAGE_STATS_ENABLED ?= 0
export RAY_AUTH_MODE ?= disabled
export RAY_DEDUP_LOGS ?= 0
export MLFLOW_DISABLE_TELEMETRY ?= true
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION ?= false
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export PYTHONUNBUFFERED := 1

.PHONY: help install services browser podman image demo up down test test-fast test-containers lint clean compat chaos

help:
	@echo "make demo   install, start the embedded stack, run sweeps/tversky_xor_demo.yaml"
	@echo "make test   install, start PostgreSQL if needed, run lint and the test suite"
	@echo "make test-fast  install, start PostgreSQL if needed, run the unit tests only: no lint, no test marked"
	@echo "            stack (Ray, API/MLflow servers, workers, containers); about 3 minutes on 2 cores"
	@echo "make down   stop the stack started by make demo"
	@echo "make chaos  the production stack under random kills for MINUTES (10), seeded by SEED; then every check"
	@echo "make image  build the project image (podman or docker; offline: base from the Debian mirror)"

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	# torch/torchvision come from this machine's local wheels (pip's constraint file caps them)
	$(PY) -m pip install -qq -r requirements.lock
	$(PY) -m pip install -qq --no-deps -e .
	touch $(STAMP)

# PostgreSQL runs on this kind of machine already; start the packaged cluster if it does not answer.
services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { \
	  echo "starting PostgreSQL"; \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main start; \
	  for i in $$(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; }

# Debian's chromium for the MLflow UI check in tests/browser (about 25 s the first time).
browser:
	@scripts/install-chromium.sh

# Debian's podman (and runc) for make image and the container tier in tests/containers.
podman:
	@scripts/install-podman.sh

# The project image, layerlab:latest (README: size and build time). TORCH_VARIANT=cpu|cuda to choose.
image: podman
	scripts/build-image.sh

demo: install
	@$(LAYERLAB) down >/dev/null 2>&1 || true
	$(LAYERLAB) up --detach
	$(LAYERLAB) submit sweeps/tversky_xor_demo.yaml --wait
	@echo
	@echo "Open the MLflow UI at http://127.0.0.1:5000 (experiment tversky-xor-demo: parent run, one child per trial, plots)."
	@echo "Load the model:  $(PY) -c \"import mlflow; m = mlflow.pytorch.load_model('models:/tversky-xor@champion')\""
	@echo "   (with MLFLOW_TRACKING_URI=sqlite:///$$(pwd)/.layerlab/mlflow.db, or download it: $(LAYERLAB) pull tversky-xor@champion ./model)"
	@echo "Stop the stack with: make down"

up: install
	$(LAYERLAB) up

down:
	-$(LAYERLAB) down

lint: install
	$(VENV)/bin/ruff check service workers jobs layerlab tests benchmarks
	$(VENV)/bin/ruff format --check service workers jobs layerlab tests benchmarks
	$(VENV)/bin/mypy

test: install services browser podman lint
	$(PY) -m pytest -q -n $(TEST_PROCESSES) --dist loadscope --no-loadscope-reorder --durations=40

# The fast tier: every test not marked `stack` (pyproject.toml: no Ray, no API, MLflow or S3 server, no worker
# processes, no containers; tests/conftest.py marks the stack folders), on the machine's PostgreSQL. Lint is not
# run here: `make lint` or `make test` runs it.
test-fast: install services
	$(PY) -m pytest -q -n $(TEST_PROCESSES) -m "not stack"

# The container tier alone (tests/containers: the image built, the compose stack run from it). `make test`
# runs it too; LAYERLAB_CONTAINER_TIER=0 leaves it out there.
test-containers: install services podman
	$(PY) -m pytest -q tests/containers

# The chaos soak (tests/chaos.py): the production stack on loopback, three users' sweeps, random kills of its
# parts for MINUTES, then every check; SEED picks the kills. RELIABILITY.md: its figures.
MINUTES ?= 10
SEED ?= $(shell date +%s)
chaos: install services
	$(PY) -m tests.chaos --minutes $(MINUTES) --seed $(SEED)

# The fault and end-to-end suites against Ray 2.59.0 as well (RELIABILITY.md; about 20 minutes).
compat: install services
	scripts/check-compat.sh

clean:
	rm -rf .layerlab .pytest_cache
