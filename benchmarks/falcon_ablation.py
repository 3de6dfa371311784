"""Falcon training ablation: teacher forcing vs the paper's CSGD vs CSGD as decoded, k = 2 and 3,
and the in-block assignment, at one training-token budget, each trained to convergence.

    python benchmarks/falcon_ablation.py --tokens 1000000 data.features=offline
    python benchmarks/falcon_ablation.py --runs decode_k2 decode_k2_reversed --tokens all

Runs (`RUNS`; --runs picks some): tf_k{k} (`drafter.csgd.teacher_forcing_only=true`),
paper_k{k} (`drafter.csgd.variant=paper`), decode_k{k} (the default), decode_k{k}_reversed and
tf_k{k}_reversed (`drafter.model.assignment=reversed`), decode_k{k}_w05 (the own-block loss at
half the teacher-forced loss's weight, `drafter.csgd.own_pass_weight=0.5`), for k = 2, 3. Extra
overrides do not rename a run: give a changed recipe its own entry in RUNS. Every run is
`python train.py +experiment=falcon_smollm2` on the same nested subset of at most --tokens
answer tokens, under the experiment's one budget rule (up to 10 epochs and 2,000 steps, early
stopping and best.ckpt on val/accept_len_est); extra overrides go to every run alike. Then, per run:

- held-out per-depth rates on the corpus's validation split (its offline feature cache):
  P(depth d's top-1 draft right | the depths above right), as decoded
  (`drafters.eval.tune.falcon_depth_counts`: depths 1..k teacher-forced at blocks aligned on
  the root, k+1..2k from an own-block pass). "TF estimate" is what assuming teacher-forced rates
  for the second pass predicts: depths 1..k repeated.
- τ (bonus included) on held-out ShareGPT first turns with the chain of depth 2k, each output
  checked against the AR loop's, split by N mod k (a misalignment shows as a gap).

Resumable as data_scaling.py: an exported run is not retrained, a decoded one is not redone
(`--out/<run>.json`), and a finished run with the same training config under the same --log-dir
is reused whatever its name: decode_k2 at --tokens N is data_scaling.py's Falcon run at N when
both get the same overrides. Hours on one core: pin it (`taskset -c 1`) and run it in the
background.
"""

from __future__ import annotations

import argparse
import json

from heldout import (
    ROOT,
    add_run_args,
    decode_heldout,
    heldout_depths,
    start,
    steps_cell,
    token_budget,
    train_run,
)

RUNS: dict[str, list[str]] = {}
for _k in (2, 3):
    _base = [f"drafter.model.k={_k}"]
    RUNS[f"tf_k{_k}"] = [*_base, "drafter.csgd.teacher_forcing_only=true"]
    RUNS[f"paper_k{_k}"] = [*_base, "drafter.csgd.variant=paper"]
    RUNS[f"decode_k{_k}"] = [*_base, "drafter.csgd.variant=decode"]
    RUNS[f"decode_k{_k}_reversed"] = [*_base, "drafter.model.assignment=reversed"]
    RUNS[f"tf_k{_k}_reversed"] = [*RUNS[f"tf_k{_k}"], "drafter.model.assignment=reversed"]
    RUNS[f"decode_k{_k}_w05"] = [*_base, "drafter.csgd.own_pass_weight=0.5"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument(
        "--tokens", type=token_budget, default="1000000", help="answer tokens trained on (or all)"
    )
    p.add_argument("--dataset-dir", default=str(ROOT / "data/distilled/smollm2_135m/train"))
    p.add_argument("--cache-dir", default=str(ROOT / "data/features/smollm2_135m"))
    p.add_argument("--max-length", type=int, default=512, help="as the training runs")
    p.add_argument("--val-fraction", type=float, default=0.05, help="as the training runs")
    add_run_args(p, "falcon_ablation", record=True)
    args = p.parse_args()
    target, prompts, out = start(args)
    limit = "null" if args.tokens == "all" else args.tokens
    rows = []
    for name in args.runs:
        result_path = out / f"ablation_{name}_{args.tokens}.json"
        if result_path.is_file():
            rows.append(json.loads(result_path.read_text()))
            continue
        over = [f"data.max_train_tokens={limit}", *RUNS[name], *args.overrides]
        run_dir = train_run(f"ablation_{name}_{args.tokens}", "falcon_smollm2", over, args.log_dir)
        k = int(RUNS[name][0].rsplit("=", 1)[1])
        row = decode_heldout(run_dir, target, prompts, args.max_new_tokens, 2 * k)
        rates = heldout_depths(run_dir, target, args.dataset_dir, args.cache_dir,
                               args.max_length, args.val_fraction)  # fmt: skip
        row.update(name=name, k=k, depth_rates=rates)
        rows.append(row)
        result_path.write_text(json.dumps(row, indent=1))
        print(f"[ablation] {json.dumps(row)}", flush=True)
    print(f"\n{args.tokens} answer tokens; {len(prompts)} held-out ShareGPT first turns, "
          f"{args.max_new_tokens} new tokens, greedy, chain of depth 2k, every output equal "
          "to AR's; per-depth rates on the validation split, each given the depths above "
          "right\n")  # fmt: skip
    print("| run | k | steps | decode-faithful rates, depth 1..2k | TF estimate | τ "
          "| τ by N mod k |")  # fmt: skip
    print("|---|---:|---:|---|---|---:|---|")
    for r in rows:
        k, rates = r["k"], r["depth_rates"]
        tf = rates[:k] * 2
        phases = " / ".join(f"{p}: {t:.2f}" for p, t in r["tau_by_phase"].items() if t)
        print(f"| {r['name']} | {k} | {steps_cell(r)} | {' '.join(f'{x:.3f}' for x in rates)} "
              f"| {' '.join(f'{x:.3f}' for x in tf)} | {r['tau']:.3f} | {phases} |")  # fmt: skip


if __name__ == "__main__":
    main()
