# nmt: everything a fresh machine needs is installed by `make install`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
ARGS   ?=
TORCH_SPEC ?= torch>=2.1

.PHONY: install demo test test-all lint clean data bench-train

install: $(STAMP)

# Keep a compatible torch that is already there; otherwise try a local wheel first
# (a registry torch is several GB of CUDA packages), then the registry.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null \
	  || $(PIP) install -q --no-index --no-deps torch 2>/dev/null \
	  || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev,plot]"
	touch $(STAMP)

demo: install
	$(PY) -m nmt demo configs/toy_transformer.yaml $(ARGS)

test: install
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-all: install
	$(PY) -m pytest -q $(ARGS)

lint: install
	$(VENV)/bin/ruff check nmt tests bench

# Regenerate the embedded toy corpus byte for byte.
data: install
	$(PY) -m nmt.data.toy_corpus --out data/toy

bench-train: install
	$(PY) bench/train_speed.py configs/multi30k_transformer.yaml $(ARGS)

clean:
	rm -rf runs .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
