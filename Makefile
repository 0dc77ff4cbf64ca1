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

.PHONY: venv build test test-fast lint bench clean

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

build: $(BIN)/wheelforge  ## build the shipped recipes for $(ARCH) into ./$(INDEX)
	$(BIN)/wheelforge build $(RECIPES) --arch '$(ARCH)' --index $(INDEX) $(GIT_MIRRORS)

test: venv  ## the whole suite, real end-to-end builds included (the 25 slowest listed)
	$(BIN)/python -m pytest tests --durations=25

test-fast: venv  ## unit tests only (no nvcc, no torch)
	$(BIN)/python -m pytest tests -m 'not e2e and not nvcc'

lint: venv
	$(BIN)/ruff check src tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist *.egg-info
