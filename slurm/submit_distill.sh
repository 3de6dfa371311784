#!/usr/bin/env bash
# Submit the distillation array and its merge job in one go.
#   slurm/submit_distill.sh --array=0-15 target=vicuna7b max_conversations=null
set -euo pipefail
cd "$(dirname "$0")/.."
array="$1"; shift
case "$array" in --array=*) ;; *) echo "usage: $0 --array=0-N [distill overrides]" >&2; exit 2 ;; esac
jid=$(sbatch --parsable "$array" slurm/distill.sbatch "$@")
mid=$(sbatch --parsable --dependency=afterok:"${jid%%;*}" slurm/distill.sbatch stage=merge "$@")
echo "distill array ${jid}, merge ${mid}"
