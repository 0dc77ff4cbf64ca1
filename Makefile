# wheelforge: the two set-up commands are `make build` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
ARCH   ?= 12.0
INDEX  ?= index
# flash-attn is left out: its whole build is about 3 hours on 2 cores (docs/flash-attn.md).
# Add it with RECIPES='causal-conv1d fla-core flash-linear-attention mamba-ssm flash-attn'.
RECIPES ?= causal-conv1d fla-core flash-linear-attention mamba-ssm
# offline mirrors of upstream git repositories: used when present (CI has ../shared beside
# the clone), else the recipes' URLs are fetched
UPSTREAM ?= ../shared/upstream
GIT_MIRRORS ?= $(if $(wildcard $(UPSTREAM)/state-spaces-mamba.bundle),--git-mirror \
  https://github.com/state-spaces/mamba=$(UPSTREAM)/state-spaces-mamba.bundle)

.PHONY: venv build test test-fast test-integration test-e2e lint clean

# wheelforge alone (what `make build` needs) ...
$(BIN)/wheelforge: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# ... and the test tools (pytest, ruff, mypy, uv, ray, ...), only for the targets that use them
$(VENV)/.test-tools: pyproject.toml $(BIN)/wheelforge
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.test-tools  ## create .venv with wheelforge and the test tools

build: $(BIN)/wheelforge  ## build $(RECIPES) (the shipped recipes but flash-attn) for $(ARCH) into ./$(INDEX)
	$(BIN)/wheelforge build $(RECIPES) --arch '$(ARCH)' --index $(INDEX) $(GIT_MIRRORS)

# The tests are in three cost tiers (tests/tiers.py, README's Development): unit (pure Python,
# no child process), integration (pip, uv, venvs, torch environments, servers, Chromium, git)
# and e2e (nvcc: the CUDA fixture and the real upstream builds).
PYTEST = $(BIN)/python -m pytest tests

# integration and e2e on two xdist workers, a test module (or the modules sharing the upstream
# builds) to a worker, longest first (tests/workers.py): one waits on pip, servers and
# PyPI while the other compiles
WORKERS ?= 2

test: venv  ## everything (CI runs this): the unit tier on xdist workers, then integration and e2e on $(WORKERS) workers by module (the 25 slowest listed); fails if either part failed
	status=0; \
	$(PYTEST) -m unit -n auto -q || status=1; \
	$(PYTEST) -m 'not unit' -n $(WORKERS) --dist loadgroup --durations=25 || status=1; \
	exit $$status

test-fast: venv  ## the unit tier alone, on xdist workers (-n auto): no nvcc, no torch, no child process; 1-2 min on 2 cores (README: Development)
	$(PYTEST) -m unit -n auto -q

test-integration: venv  ## the integration tier alone: pip, uv, venvs, torch environments, servers (nginx, redis), Chromium, git; no nvcc
	$(PYTEST) -m integration --durations=15

test-e2e: venv  ## the e2e tier alone: the CUDA fixture and the real upstream builds with nvcc (each recipe built once per run)
	$(PYTEST) -m e2e --durations=15

lint: venv  ## ruff and mypy --strict
	$(BIN)/ruff check src tests
	$(BIN)/mypy

clean:  ## remove .venv, build/, dist/ and *.egg-info (the index stays)
	rm -rf $(VENV) build dist *.egg-info
