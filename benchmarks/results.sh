#!/usr/bin/env bash
# Reference results on the embedded target (docs/results.md): one command for all of it.
#
#   benchmarks/results.sh            # every stage; re-running resumes where it stopped
#   benchmarks/results.sh train      # stages: corpus | train | export | tune | bench | ship | report
#
# Stages, each resumable and skipped when its output is complete:
#   corpus  the reference corpus (`make corpus`: every ShareGPT training conversation, vLLM fp32,
#           committed batch files restored), then its offline feature cache, LANES parts at once
#   train   the reference runs, each to convergence by one rule (below): Medusa; Cerberus with
#           its learned gate (the gates read the target only, so its heads are also the no-gate,
#           entropy-gate and budget-gate heads); Falcon k=2 teacher forcing only; Falcon k=2 and
#           k=3 with decode-faithful CSGD; Falcon k=2 with the paper's CSGD (the ablation); Falcon
#           k=1 in EAGLE-3's layout reading the fused target layers (falcon_eagle3_aux_smollm2: the
#           best drafter vLLM serves from us, so our decoder measures it too). LANES runs in
#           parallel, one thread each. A run is done when its fit ended and exported.
#   export  drafters-export each run's best checkpoint (val/accept_len_est) into
#           $OUT/drafters/<name>, with its tuned tree once tune has chosen one
#   tune    drafters-tune on held-out ShareGPT (never the evaluation sets): top-k accuracies,
#           the tree-size sweep, the HF peers' knobs; re-export with the chosen trees
#   bench   MT-Bench (80 questions, 2 turns) and a Spec-Bench sample (10 per category) in fp32,
#           and MT-Bench again in bf16 (its agreement with bf16 greedy reported, not assumed);
#           max_new_tokens 256, every method in one run per table: HF greedy, HF prompt lookup,
#           HF early exit, Medusa (+ hybrid tree), Cerberus (no gate, entropy, learned, budget +
#           learned), the 5 Falcons (k=2 CSGD also with the hybrid tree, k=1 fused also with the
#           budget gate)
#   ship    the fastest lossless drafter of each kind on the fp32 MT-Bench table, in bf16, into
#           zoo/smollm2_135m/<kind>/ with its τ on fixed prompts (drafters/eval/zoo.py), which
#           tests/test_zoo.py holds it to
#   report  docs/results.md from the bench and training outputs
#   plan    (not in the default list) print the train, tune and bench commands; runs nothing
#   keep    (after train, tune and bench, and by hand before a session ends) copy what is finished
#           into $KEEP (data/reference/results: bf16 drafters, tune results, bench records) to
#           commit; restore (before the first stage) brings it back on a new machine or clone
# The budget rule, the same for every run: the same corpus, batch (4 x up to 512 tokens) and
# schedule: the *_smollm2 experiments' (README: Budget): up to EPOCHS epochs and at most
# MAX_STEPS optimizer steps, validation every 100 steps on 64 held-out batches, early stopping
# when the held-out acceptance estimate (val/accept_len_est) has not improved for 4 validations;
# the drafter is the best checkpoint on it (conf/callbacks/); fit_end.json says what ended a run.
# Knobs (environment): PY, LANES (parallel lanes for corpus/train; default 2 on 2 cores),
# BENCH_LANES (default 1: the benchmark gives one request the whole machine, BENCH_THREADS =
# cores / BENCH_LANES threads, as a user would run it; more lanes are faster and are labelled;
# tune runs in the same lanes at the same threads, since it picks trees by measured speed),
# EPOCHS, MAX_STEPS, TOKENS (answer tokens trained on: all, the default, or N for the nested
# subset data_scaling.py's run at N also trains on; a finished run with the same training config
# is reused, not retrained), TABLES (which benchmark tables, default all three), OUT
# (outputs/results), KEEP (data/reference/results), ZOO (zoo/smollm2_135m), SHIP_BENCH (the
# bench run ship picks from, default the fp32 MT-Bench table; any finished drafters-bench run,
# e.g. a smaller one while the reference tables are still running).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
LANES=${LANES:-2}
CORES=$(env -u OMP_NUM_THREADS nproc)  # the cores this process may use (nproc alone obeys OMP_NUM_THREADS)
BENCH_LANES=${BENCH_LANES:-1}
BENCH_THREADS=${BENCH_THREADS:-$((CORES / BENCH_LANES > 0 ? CORES / BENCH_LANES : 1))}
EPOCHS=${EPOCHS:-10}
MAX_STEPS=${MAX_STEPS:-2000}
TOKENS=${TOKENS:-all}  # answer tokens trained on: all (the whole corpus) or N (a nested subset)
OUT=${OUT:-outputs/results}
SHIP_BENCH=${SHIP_BENCH:-$OUT/bench/mt_bench}  # the finished bench run ship picks from
ZOO=${ZOO:-zoo/smollm2_135m}
LOG=$OUT/logs
KEEP=${KEEP:-data/reference/results}  # committed: what is finished survives a replaced machine
mkdir -p "$LOG"
# The linears' measured forms (drafters/decoding/linears.py) are timed on first use and kept in
# this file: measured by tune, which runs alone at the bench's threads, and reused by the bench;
# not the user's file, where plans may have been timed while other jobs loaded the machine
export DRAFTERS_KERNEL_CACHE=${DRAFTERS_KERNEL_CACHE:-$OUT/kernels.json}

# name | experiment | extra overrides
RUNS=(
  "medusa|medusa_smollm2|"
  "cerberus|cerberus_smollm2|drafter.gate=learned"
  "falcon_k2_tf|falcon_smollm2|drafter.model.k=2 drafter.csgd.teacher_forcing_only=true"
  "falcon_k2|falcon_smollm2|drafter.model.k=2"
  "falcon_k3|falcon_smollm2|drafter.model.k=3"
  "falcon_k2_paper|falcon_smollm2|drafter.model.k=2 drafter.csgd.variant=paper"
  "falcon_k1_aux|falcon_eagle3_aux_smollm2|"
)
DATA="data.max_train_tokens=$([ "$TOKENS" = all ] && echo null || echo "$TOKENS")"
BUDGET="data.features=offline $DATA trainer.max_epochs=$EPOCHS trainer.max_steps=$MAX_STEPS \
trainer.log_every_n_steps=25 trainer.enable_progress_bar=false"

# Run "$@" (a list of shell commands, one per job) at most LANES at a time, one thread each;
# fails if any job failed, after all have ended.
lanes() {
  local cmd rc=0 s
  for cmd in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do wait -n || rc=1; done
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 bash -c "$cmd" &
  done
  while :; do  # reap the rest; 127: no child left
    s=0
    wait -n || s=$?
    [ "$s" -eq 127 ] && break
    [ "$s" -eq 0 ] || rc=1
  done
  return $rc
}

# One cache serves every run: f and its entropy for all, and falcon_k1_aux's fused target layers
# (aux files beside the shards, ~3x f's size: ~23 GB more for the whole corpus in bf16).
FEATURES=falcon_eagle3_aux_smollm2

stage_corpus() {
  make corpus PY="$PY" SHARDS="$LANES" 2>&1 | tee -a "$LOG/corpus.log"
  local cmds=() i
  for ((i = 0; i < LANES; i++)); do
    cmds+=("$PY data/cache_features.py +experiment=$FEATURES $DATA features_part=$i/$LANES \
>> $LOG/features_$i.log 2>&1")
  done
  lanes "${cmds[@]}"
  $PY data/cache_features.py +experiment=$FEATURES "$DATA" 2>&1 | tee -a "$LOG/corpus.log"
}

run_dir() { echo "logs/train/results_$1"; }
# the checkpoint a run is judged by: best.ckpt on val/accept_len_est, else last.ckpt
ckpt() { local d; d=$(run_dir "$1")/checkpoints; [ -f "$d/best.ckpt" ] && echo "$d/best.ckpt" || echo "$d/last.ckpt"; }
# done: its fit ended (early stopping or the schedule's end) and exported the chosen drafter
# (conf/callbacks/publish.yaml); an interrupted run has not exported
trained() { [ -f "$(run_dir "$1")/drafter/config.json" ]; }
# this user's training process of that run, not any process whose command line mentions it
running() { pgrep -u "$(id -u)" -f "train[.]py .*run_name=results_$1( |\$)" > /dev/null; }

train_cmd() { echo "$PY train.py +experiment=$2 run_name=results_$1 $3 $BUDGET ckpt_path=last"; }

# checked when its lane starts it: another results.sh may have trained it meanwhile. A finished
# run under logs/train with the same training config (data_scaling.py's, falcon_ablation.py's
# at the same TOKENS) is linked as results_<name> instead of trained again.
reuse_one() {  # NAME EXP EXTRA: link such a run as results_<name>; fails when there is none
  local name=$1 exp=$2 extra=$3 same
  [ ! -e "$(run_dir "$name")" ] || return 1
  # shellcheck disable=SC2086  # extra and BUDGET are lists of overrides
  same=$($PY benchmarks/heldout.py finished "$exp" $extra $BUDGET)
  [ -n "$same" ] || return 1
  ln -s "$(basename "$same")" "$(run_dir "$name")"
  echo "[results] train $name: the same training as $(basename "$same"): reused"
}
train_one() {
  local name=$1 exp=$2 extra=$3
  if trained "$name"; then echo "[results] train $name: done"; return; fi
  if running "$name"; then echo "[results] train $name: running in another process"; return; fi
  if reuse_one "$name" "$exp" "$extra"; then return; fi
  $(train_cmd "$name" "$exp" "$extra") > "$LOG/train_$name.log" 2>&1 ||
    { echo "[results] train $name: failed (see $LOG/train_$name.log)"; return 1; }
  echo "[results] train $name: done"
}
export -f trained running train_cmd train_one reuse_one run_dir
export PY BUDGET LOG

stage_train() {
  local cmds=() spec name exp extra
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    cmds+=("train_one $name $exp '$extra'")
  done
  lanes "${cmds[@]}"
}

export_one() {  # export a run's best checkpoint, with its tuned tree once tune has chosen one
  local tree=$OUT/tune/$1.tree.json
  [ -f "$tree" ] || tree=
  $PY -m drafters.cli export "$(ckpt "$1")" "$OUT/drafters/$1" --force ${tree:+--tree "$tree"}
}

export_all() {
  local spec name exp extra
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    if trained "$name"; then export_one "$name"; else echo "[results] $name: not trained yet"; fi
  done
}

stage_export() { export_all; }

tune_one() {  # NAME (a run) or "peers"; skipped when its result is newer than the checkpoint
  local name=$1 res=$OUT/tune/$1.json args
  if [ "$name" = peers ]; then
    args="--peers"
    [ -f "$res" ] && { echo "[results] tune peers: done"; return; }
  else
    args="--drafter $OUT/drafters/$name"
    [ "$res" -nt "$(ckpt "$name")" ] &&
      { echo "[results] tune $name: done"; return; }
  fi
  if pgrep -u "$(id -u)" -f "drafters[.]cli tune $args( |\$)" > /dev/null; then
    echo "[results] tune $name: running in another process"; return
  fi
  $(tune_cmd "$args") > "$LOG/tune_$name.log" 2>&1 ||
    { echo "[results] tune $name: failed (see $LOG/tune_$name.log)"; return 1; }
  echo "[results] tune $name: done"
}
# at the bench's threads: the trees and the peers' knobs are chosen by speed, and what is fastest
# depends on the threads (a linear's measured form, drafters/decoding/linears.py)
tune_cmd() { echo "$PY -m drafters.cli tune $1 --out $OUT/tune --threads $BENCH_THREADS"; }
export -f tune_one tune_cmd ckpt
export OUT BENCH_THREADS

stage_tune() {  # on held-out ShareGPT only, BENCH_LANES at a time; then re-export with the chosen trees
  mkdir -p "$OUT/tune"
  local cmds=(tune_one\ peers) spec name exp extra
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    if ! trained "$name"; then echo "[results] tune $name: not trained yet, skipped"; continue; fi
    [ -f "$OUT/drafters/$name/config.json" ] || export_one "$name"
    cmds+=("tune_one $name")
  done
  LANES=$BENCH_LANES lanes "${cmds[@]}"
  export_all
}

bench_args() {  # the methods of every table: HF peers with their tuned knobs, every drafter
  local d=$OUT/drafters
  local peers
  if [ ! -f "$OUT/tune/peers.json" ]; then
    echo "[results] $OUT/tune/peers.json is missing: run the tune stage first" >&2
    return 1
  fi
  peers=$($PY -c "import json,sys; p=json.load(open(sys.argv[1])); \
print(f'--prompt-lookup {p[\"prompt_lookup\"]} --early-exit-layer {p[\"early_exit_layer\"]}', \
      f'--early-exit-tokens {p[\"early_exit_tokens\"]}', \
      f'--early-exit-threshold {p.get(\"early_exit_threshold\", 0.4)}')" \
    "$OUT/tune/peers.json")
  echo "--methods hf_greedy hf_prompt_lookup hf_early_exit $peers \
--drafter $d/medusa@none,hybrid --drafter $d/cerberus@none,entropy,learned,budget+learned \
--drafter $d/falcon_k2_tf@none --drafter $d/falcon_k2@none,hybrid --drafter $d/falcon_k3@none \
--drafter $d/falcon_k2_paper@none --drafter $d/falcon_k1_aux@none,budget --max-new-tokens 256 --turns 2 --threads $BENCH_THREADS"
}

# name | drafters-bench arguments of the table (besides bench_args)
ALL_TABLES=("mt_bench|--bench mt_bench" "spec_bench|--bench spec_bench --per-category 10"
  "mt_bench_bf16|--bench mt_bench --dtype bfloat16")
TABLES=${TABLES:-mt_bench spec_bench mt_bench_bf16}

bench_cmd() {  # TABLE_ARGS OUT_NAME SHARD BENCH_ARGS
  echo "$PY -m drafters.cli bench $1 $4 --shard $3/$BENCH_LANES --out $OUT/bench/$2"
}

stage_bench() {  # one run per table, BENCH_LANES shards; resumes from the records under --out
  local table name args bargs
  bargs=$(bench_args)
  for table in "${ALL_TABLES[@]}"; do
    IFS='|' read -r name args <<<"$table"
    [[ " $TABLES " == *" $name "* ]] || continue
    local cmds=() i
    for ((i = 0; i < BENCH_LANES; i++)); do
      cmds+=("$(bench_cmd "$args" "$name" "$i" "$bargs") >> $LOG/bench_${name}_$i.log 2>&1")
    done
    LANES=$BENCH_LANES lanes "${cmds[@]}"
    $PY -m drafters.cli bench --merge --out "$OUT/bench/$name"
  done
}

ship_cmd() { echo "$PY -m drafters.eval.zoo ship --bench $SHIP_BENCH --out $ZOO --made-by $OUT/made_by.json"; }

stage_ship() {  # the best of each kind on the fp32 MT-Bench table, with how each was made
  local spec name exp extra
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    printf '%s\ttrain: %s; tune: %s; export: drafters-export %s OUT --dtype bfloat16 --tree %s\n' \
      "$name" "$(train_cmd "$name" "$exp" "$extra")" \
      "$(tune_cmd "--drafter $OUT/drafters/$name")" "$(ckpt "$name")" "$OUT/tune/$name.tree.json"
  done | $PY -c "import json, sys
print(json.dumps(dict(line.rstrip('\n').split('\t', 1) for line in sys.stdin), indent=1))" \
    > "$OUT/made_by.json"
  $(ship_cmd)
}

stage_report() {
  $PY benchmarks/results_report.py --results "$OUT" --out docs/results.md
}

# The committed copy of what is finished (benchmarks/results_keep.py): a machine replaced between
# sessions loses outputs/ and logs/, and the stages take longer than one session
stage_restore() {  # then link the restored runs that match, so a later stage alone finds them
  local spec name exp extra
  $PY benchmarks/results_keep.py restore --out "$OUT" --logs logs/train --keep "$KEEP"
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    trained "$name" || reuse_one "$name" "$exp" "$extra" || true
  done
}
stage_keep() { $PY benchmarks/results_keep.py keep --out "$OUT" --logs logs/train --keep "$KEEP"; }

stage_plan() {  # print the train, tune, bench and ship commands (tests check them); runs nothing
  local spec name exp extra table args bargs
  bargs=$(bench_args)
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name exp extra <<<"$spec"
    echo "train $name: $(train_cmd "$name" "$exp" "$extra")"
    echo "tune $name: $(tune_cmd "--drafter $OUT/drafters/$name")"
  done
  echo "tune peers: $(tune_cmd --peers)"
  for table in "${ALL_TABLES[@]}"; do
    IFS='|' read -r name args <<<"$table"
    echo "bench $name: $(bench_cmd "$args" "$name" 0 "$bargs")"
  done
  echo "ship: $(ship_cmd)"
}

main() {
  local stages=(corpus train export tune bench ship report) s restored=
  [ $# -gt 0 ] && stages=("$@")
  for s in "${stages[@]}"; do
    case $s in  # the kept state comes back before the first stage that makes or reads it
      corpus | train | export | tune | bench | ship)
        [ -n "$restored" ] || { stage_restore; restored=1; } ;;
    esac
    echo "[results] stage $s ($(date -u +%FT%TZ))"
    "stage_$s"
    case $s in train | tune | bench) stage_keep ;; esac
  done
}

main "$@"; exit $?  # on one line: bash has read all it runs, so editing this file mid-run is safe
