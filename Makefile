# nmt: everything a fresh machine needs is installed by `make install`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
ARGS   ?=
TEST_JOBS ?= 2
TORCH_SPEC ?= torch>=2.1

.PHONY: install demo test test-slow test-all lint clean data bench-train bench-data

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

# Train a Transformer on the embedded toy corpus (800 updates, about 3.5 minutes on a free 2-core CPU),
# score it on the toy test set, and translate a few test sentences.
demo: install
	$(NMT) train configs/toy_transformer.yaml --restart $(ARGS)
	$(NMT) --quiet eval -c $(TOY)/best.pt --split test
	head -n 3 data/toy/test.en > $(TOY)/sample.en
	$(NMT) --quiet translate -c $(TOY)/best.pt -i $(TOY)/sample.en -o $(TOY)/sample.de
	paste -d '\n' $(TOY)/sample.en $(TOY)/sample.de

# The tests run in TEST_JOBS processes (pytest-xdist; 0 runs them in this one): most of them are single-
# threaded, or wait on processes they start, so two processes take 7 to 8 minutes on a 2-core AVX2-only AMD EPYC
# (434 s in a clean-clone CI on 2026-12-07, 1,903 tests, where the same machine then took 589 s before six bench
# runs moved to test-slow and a small corpus's tokenizer sample was drawn without a child process), 6.5 to
# 8 minutes on 2 cores with AVX-512 (before 1,800 tests).
test: install
	$(PY) -m pytest -q -m "not slow" -n $(TEST_JOBS) $(ARGS)

# The end-to-end tests marked slow (signals, random SIGKILLs, torchrun, compile, the bench scripts run end
# to end): 77 tests, in one process (some time their signals); CI runs them after `make test`.
test-slow: install
	$(PY) -m pytest -q -m slow $(ARGS)

test-all: install
	$(PY) -m pytest -q $(ARGS)

lint: install
	$(VENV)/bin/ruff check nmt tests bench

# Regenerate the embedded toy corpus byte for byte.
data: install
	$(PY) -m nmt.data.toy_corpus --out data/toy

# ---------------------------------------------------------------- experiments
# Each target trains (resuming an interrupted run), scores every test set and writes
# results/<config>.json. Pass overrides with ARGS, e.g. ARGS="--set train.max_steps=50".
# Multi30k comes from NMT_DATA (default ../shared/data/multi30k); without it, from the
# Hugging Face hub dataset bentrevett/multi30k (test_2016_flickr only).
export NMT_DATA ?= ../shared/data/multi30k
HUB_SPLIT = {kind: hf, path: bentrevett/multi30k, split: $(1)}
M30K_SOURCE := $(if $(wildcard $(NMT_DATA)/train.de*),,\
  --set 'data.train=$(call HUB_SPLIT,train)' --set 'data.valid=$(call HUB_SPLIT,validation)' \
  --set 'data.test={test_2016_flickr: $(call HUB_SPLIT,test)}')
TOY_EXPERIMENTS := toy_transformer toy_rnn_noattn toy_rnn_bahdanau toy_rnn_luong_general toy_rnn_luong_dot
# NPROC=N trains with N torchrun processes (of one thread each on a CPU, torchrun's default); on a 2-core
# CPU, 2 such processes trained the Multi30k Transformer as fast as one process with 2 threads (README).
NPROC ?= 1
EXPERIMENT = $(if $(filter 1,$(NPROC)),$(NMT),$(VENV)/bin/torchrun --standalone --nproc_per_node $(NPROC) -m nmt) \
  experiment configs/$(1).yaml $(2) $(ARGS)

.PHONY: toy-all multi30k-all multi30k-transformer multi30k-transformer-en-de multi30k-transformer-dropout01 \
        multi30k-rnn-bahdanau multi30k-rnn-luong multi30k-rnn-noattn results analysis analysis-multi30k

toy-all: install
	for c in $(TOY_EXPERIMENTS); do $(call EXPERIMENT,$$c) || exit 1; done
multi30k-transformer: install
	$(call EXPERIMENT,multi30k_transformer,$(M30K_SOURCE))
multi30k-transformer-dropout01: install
	$(call EXPERIMENT,multi30k_transformer_dropout01,$(M30K_SOURCE))
multi30k-transformer-en-de: install
	$(call EXPERIMENT,multi30k_transformer_en_de,$(M30K_SOURCE))
multi30k-rnn-bahdanau: install
	$(call EXPERIMENT,multi30k_rnn_bahdanau,$(M30K_SOURCE))
multi30k-rnn-luong: install
	$(call EXPERIMENT,multi30k_rnn_luong_general,$(M30K_SOURCE))
multi30k-rnn-noattn: install
	$(call EXPERIMENT,multi30k_rnn_noattn,$(M30K_SOURCE))
multi30k-all: multi30k-transformer multi30k-transformer-dropout01 multi30k-transformer-en-de multi30k-rnn-bahdanau multi30k-rnn-luong multi30k-rnn-noattn

# BLEU by source length and attention heatmaps of the toy models (after make toy-all).
analysis: install
	$(NMT) --quiet analyze $(foreach e,$(TOY_EXPERIMENTS),-c $(e:toy_%=%)=runs/$(e)/best.pt) \
	  --report results --sentences 27,41 $(ARGS)

# The same for the Multi30k experiments that have results (after make multi30k-*), on
# test_2016_flickr: results/multi30k/analysis.md, from the checkpoints those results scored.
M30K_RUNS = $(strip $(foreach e,multi30k_transformer multi30k_rnn_bahdanau multi30k_rnn_luong_general multi30k_rnn_noattn,\
  $(if $(wildcard results/$(e).json),$(e:multi30k_%=%)=$(shell $(PYTHON) -c \
    "import json; print(json.load(open('results/$(e).json'))['checkpoint'])"))))
analysis-multi30k: install
	$(if $(M30K_RUNS),,$(error no results/multi30k_*.json: run make multi30k-transformer and friends first))
	$(NMT) --quiet analyze $(foreach r,$(M30K_RUNS),-c $(r)) --report results/multi30k --sentences 3,16 $(ARGS)

# Render results/*.json into the README's results table.
results: install
	$(PY) -m nmt.results

bench-train: install
	$(PY) bench/train_speed.py configs/multi30k_transformer.yaml $(ARGS)

# Time each phase of `nmt train` on an N-pair corpus written outside the repository, e.g.
# make bench-data ARGS="--pairs 100000 1000000".
bench-data: install
	$(PY) bench/data_scale.py $(ARGS)

clean:
	rm -rf runs .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
