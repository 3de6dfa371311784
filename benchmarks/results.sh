#!/usr/bin/env bash
# Reference results on the embedded target (docs/results.md): one command for all of it.
#
#   benchmarks/results.sh            # every stage; re-running resumes where it stopped
#   benchmarks/results.sh train      # one stage: corpus | train | export | tune | bench | report
#
# Stages, each resumable and skipped when its output is complete:
#   corpus  distil ShareGPT conversations with SmolLM2-135M-Instruct, cache offline features once
#   train   the 5 training runs at one training budget (same data, batches, steps): Medusa;
#           Cerberus with its learned gate (the gates read the target only, so the heads are the
#           no-gate and entropy-gate heads too); Falcon k=2 teacher forcing only; Falcon k=2
#           CSGD; Falcon k=3 CSGD. LANES runs in parallel, one thread each.
#   export  export.py each run's last checkpoint into outputs/results/drafters/<name>
#   tune    python -m drafters.tune on held-out ShareGPT (never the evaluation sets): top-k
#           accuracies, the tree-size sweep, the HF peers' knobs; re-export with the chosen trees
#   bench   MT-Bench (80 questions, 2 turns) and a Spec-Bench sample (10 per category),
#           max_new_tokens 256, every method in one run per table: HF greedy, HF prompt lookup,
#           HF early exit, Medusa, Cerberus (no gate, entropy gate, learned gate), the 3 Falcons
#   report  docs/results.md from the bench and training outputs
# Knobs (environment): PY, LANES (parallel lanes for train/bench; default 2 on 2 cores),
# STEPS (training steps per run), CONVERSATIONS (corpus size), OUT (outputs/results).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
LANES=${LANES:-2}
STEPS=${STEPS:-100}
CONVERSATIONS=${CONVERSATIONS:-320}
OUT=${OUT:-outputs/results}
LOG=$OUT/logs
mkdir -p "$LOG"

# name | experiment | extra overrides. One budget for all: same corpus, batch, max_length, steps.
RUNS=(
  "medusa|medusa_smollm2|"
  "cerberus|cerberus_smollm2|drafter.gate=learned"
  "falcon_k2_tf|falcon_smollm2|drafter.model.k=2 drafter.csgd.teacher_forcing_only=true"
  "falcon_k2|falcon_smollm2|drafter.model.k=2"
  "falcon_k3|falcon_smollm2|drafter.model.k=3"
)
BUDGET="data.features=offline data.max_length=512 data.batch_size=4 \
trainer.max_steps=$STEPS trainer.max_epochs=1000 trainer.val_check_interval=$((STEPS / 2)) \
trainer.check_val_every_n_epoch=null callbacks.checkpoint.every_n_train_steps=$((STEPS / 2)) \
trainer.log_every_n_steps=5 optim.warmup_steps=10 trainer.enable_progress_bar=false"

run_dir() { echo "logs/train/results_$1"; }

# Run "$@" (a list of shell commands, one per job) at most LANES at a time, one thread each.
lanes() {
  local pids=() cmd
  for cmd in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do wait -n; done
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 bash -c "$cmd" &
    pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

stage_corpus() {
  $PY data/distill.py max_conversations="$CONVERSATIONS" 2>&1 | tee -a "$LOG/corpus.log"
  $PY data/cache_features.py +experiment=falcon_smollm2 2>&1 | tee -a "$LOG/corpus.log"
}

trained() { [ -f "$(run_dir "$1")/checkpoints/last.ckpt" ] &&
  $PY -c "import sys,torch; sys.exit(torch.load(sys.argv[1], map_location='cpu', weights_only=False)['global_step'] < $STEPS)" \
    "$(run_dir "$1")/checkpoints/last.ckpt"; }

stage_train() {
  local cmds=() spec name exp extra
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    if trained "$name"; then echo "[results] train $name: done"; continue; fi
    cmds+=("$PY train.py +experiment=$exp run_name=results_$name $extra $BUDGET ckpt_path=last \
      > $LOG/train_$name.log 2>&1 && echo '[results] train $name: done'")
  done
  [ ${#cmds[@]} -eq 0 ] || lanes "${cmds[@]}"
}

export_all() {  # export each run's last checkpoint; with a tuned tree when tune has chosen one
  local spec name exp extra tree
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    tree=$OUT/tune/$name.tree.json
    [ -f "$tree" ] || tree=
    $PY export.py "$(run_dir "$name")/checkpoints/last.ckpt" "$OUT/drafters/$name" --force \
      ${tree:+--tree "$tree"}
  done
}

stage_export() { export_all; }

stage_tune() {  # on held-out ShareGPT only; then re-export with the chosen trees
  mkdir -p "$OUT/tune"
  local d=$OUT/drafters
  lanes "$PY -m drafters.tune --peers --drafter $d/medusa --drafter $d/cerberus --out $OUT/tune \
      --threads 1 > $LOG/tune_heads.log 2>&1" \
    "$PY -m drafters.tune --drafter $d/falcon_k2_tf --drafter $d/falcon_k2 --drafter $d/falcon_k3 \
      --out $OUT/tune --threads 1 > $LOG/tune_falcon.log 2>&1"
  export_all
}

bench_args() {  # the methods of every table: HF peers with their tuned knobs, every drafter
  local d=$OUT/drafters
  local peers
  peers=$($PY -c "import json,sys; p=json.load(open(sys.argv[1])); \
print(f'--prompt-lookup {p[\"prompt_lookup\"]} --early-exit-layer {p[\"early_exit_layer\"]}')" \
    "$OUT/tune/peers.json")
  echo "--methods hf_greedy hf_prompt_lookup hf_early_exit $peers --drafter $d/medusa@none \
--drafter $d/cerberus@none,entropy,learned --drafter $d/falcon_k2_tf --drafter $d/falcon_k2 \
--drafter $d/falcon_k3 --max-new-tokens 256 --turns 2 --threads 1"
}

stage_bench() {  # one run per table, LANES shards; resumes from the records under --out
  local table name args
  for table in "mt_bench|--bench mt_bench" "spec_bench|--bench spec_bench --per-category 10"; do
    IFS='|' read -r name args <<<"$table"
    local cmds=() i
    for ((i = 0; i < LANES; i++)); do
      cmds+=("$PY -m drafters.bench $args $(bench_args) --shard $i/$LANES \
        --out $OUT/bench/$name >> $LOG/bench_${name}_$i.log 2>&1")
    done
    lanes "${cmds[@]}"
    $PY -m drafters.bench --merge --out "$OUT/bench/$name"
  done
}

stage_report() {
  $PY -m drafters.results_report --results "$OUT" --out docs/results.md
}

STAGES=(corpus train export tune bench report)
[ $# -gt 0 ] && STAGES=("$@")
for s in "${STAGES[@]}"; do
  echo "[results] stage $s ($(date -u +%FT%TZ))"
  "stage_$s"
done
