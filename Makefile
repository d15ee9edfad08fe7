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

NMT  := $(VENV)/bin/nmt
TOY  := runs/toy_transformer

# Train a Transformer on the embedded toy corpus (about 4 minutes on 2 CPU cores),
# score it on the toy test set, and translate a few test sentences.
demo: install
	$(NMT) train configs/toy_transformer.yaml --restart $(ARGS)
	$(NMT) --quiet eval -c $(TOY)/best.pt --split test
	head -n 3 data/toy/test.en > $(TOY)/sample.en
	$(NMT) --quiet translate -c $(TOY)/best.pt -i $(TOY)/sample.en -o $(TOY)/sample.de
	paste -d '\n' $(TOY)/sample.en $(TOY)/sample.de

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
