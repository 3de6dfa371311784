#!/usr/bin/env bash
# Submit the distillation array and its merge job in one go.
#   slurm/submit_distill.sh --array=0-15 target=vicuna7b max_conversations=null
#   slurm/submit_distill.sh --array=0-3 --script=slurm/distill_vllm.sbatch target=vicuna7b \
#       generation.backend=vllm max_conversations=null     # 4 nodes of vLLM engines
set -euo pipefail
cd "$(dirname "$0")/.."
array="$1"; shift
case "$array" in --array=*) ;; *) echo "usage: $0 --array=0-N [--script=FILE] [distill overrides]" >&2; exit 2 ;; esac
script=slurm/distill.sbatch
case "${1:-}" in --script=*) script="${1#--script=}"; shift ;; esac
jid=$(sbatch --parsable "$array" "$script" "$@")
mid=$(sbatch --parsable --dependency=afterok:"${jid%%;*}" slurm/distill.sbatch stage=merge "$@")
echo "distill array ${jid} (${script}), merge ${mid}"
