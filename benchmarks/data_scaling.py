"""Data-scaling curve: held-out acceptance of drafters trained on more and more distilled tokens.

    python benchmarks/data_scaling.py --drafters falcon medusa --tokens 100000 300000 1000000 all
    python benchmarks/data_scaling.py --drafters falcon --tokens 100000 -- data.features=offline
    python benchmarks/data_scaling.py --tokens 1000000 --vocab 4096 8192 16384 -- \
        data.features=offline

For every drafter, token budget and draft vocabulary size (--vocab, run name suffix _v<V_d>;
default: the curve's V_d = CURVE_VOCAB = 8,192, no suffix, whatever the experiment's default is,
so the curve's rows stay comparable across a change of that default): one `python train.py
+experiment=<drafter>_smollm2` run on a nested subset of at most that many answer tokens
(`data.max_train_tokens`; `all` = the whole corpus), under one budget rule for every run (the
experiment's: up to 10 epochs and 2,000 steps, early stopping and best.ckpt on
val/accept_len_est; extra overrides go to every run alike), exported at its end
(`logs/train/<run>/drafter`). Then the drafter decodes held-out ShareGPT
first turns (the corpus's validation split by conversation id: never trained on, never the
evaluation sets) beside the plain AR loop, greedy, on the drafter's chain of depth --depth;
every output is checked against AR's. Reported per run: answer tokens trained on, the steps,
epochs and what ended the fit (fit_end.json), τ (bonus included) and the per-depth acceptance
P(a >= d) = share of verification steps that accepted at least d drafted tokens.

Resumable: a finished run (its `drafter/` exported) is not trained again, an interrupted one
resumes (`ckpt_path=last`), and a decoded run's result (`--out/<run>.json`) is kept. A finished
run with the same training config under the same --log-dir is reused whatever its name (the
Falcon ablation's decode_k2 at the same budget), and a run folder that holds other settings is
refused, naming them (benchmarks/heldout.py, train_run).
Hours on one core: pin it (`taskset -c 1`) and run it in the background.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from heldout import (
    add_run_args,
    decode_heldout,
    precision_cell,
    start,
    steps_cell,
    token_budget,
    train_run,
    train_speed,
)

CURVE_VOCAB = 8192  # the draft vocabulary of the curve's rows (the runs named without a suffix)


def run_name(drafter: str, budget: str, vocab: int = CURVE_VOCAB) -> str:
    return f"scaling_{drafter}_{budget}" + (f"_v{vocab}" if vocab != CURVE_VOCAB else "")


def vocab_cell(row: dict) -> str:
    """V_d (held-out coverage); 'full' without a draft vocabulary, '?' for a row decoded before
    the column existed."""
    if "draft_vocab" not in row:
        return "?"
    vd = row["draft_vocab"]
    return f"{vd['size']} ({vd['coverage_validation']:.3f})" if vd else "full"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--drafters", nargs="+", default=["falcon", "medusa"])
    p.add_argument(
        "--tokens", nargs="+", type=token_budget, default=["100000", "300000", "1000000", "all"]
    )
    p.add_argument(
        "--vocab", nargs="+", type=int, default=None, metavar="V_D",
        help=f"draft vocabulary sizes (drafter.model.draft_vocab_size; default {CURVE_VOCAB}, the "
        "curve's, runs named without a suffix, which a run at that size reuses; an override "
        "drafter.model.draft_vocab_size=V instead sets it for every run, names unchanged)",
    )  # fmt: skip
    p.add_argument("--depth", type=int, default=4, help="chain depth decoded (Falcon: k x passes)")
    add_run_args(p, "scaling", record=True)
    args = p.parse_args()
    key = "drafter.model.draft_vocab_size="
    vocab_overridden = any(o.startswith(key) for o in args.overrides)
    if args.vocab and vocab_overridden:
        p.error(f"set the draft vocabulary by --vocab or by the override {key}V, not both")
    vocabs = args.vocab or [CURVE_VOCAB]
    target, prompts, out = start(args)
    rows = []
    for drafter, budget, vocab in itertools.product(args.drafters, args.tokens, vocabs):
        name = run_name(drafter, budget, vocab)
        result_path = out / f"{name}.json"
        if result_path.is_file():
            rows.append(json.loads(result_path.read_text()))
            continue
        limit = "null" if budget == "all" else budget
        over = [f"data.max_train_tokens={limit}", *args.overrides]
        if not vocab_overridden:
            over.append(f"{key}{vocab}")
        run_dir = train_run(name, f"{drafter}_smollm2", over, args.log_dir)
        rows.append(decode_heldout(run_dir, target, prompts, args.max_new_tokens, args.depth))
        result_path.write_text(json.dumps(rows[-1], indent=1))
        print(f"[scaling] {json.dumps(rows[-1])}", flush=True)
    print(f"\n{len(prompts)} held-out ShareGPT first turns, {args.max_new_tokens} new tokens, "
          f"greedy, chain of depth {args.depth}, every output equal to AR's\n")  # fmt: skip
    print("\n".join(table_lines(rows, Path(args.log_dir))))


def read_records(folder: Path) -> list[dict]:
    """Every decoded run under `folder` (benchmarks/records/scaling), by drafter, then answer
    tokens trained on, then draft vocabulary size."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("scaling_*.json"))]
    return sorted(rows, key=lambda r: (r["kind"], r["train_answer_tokens"] or 0,
                                       (r.get("draft_vocab") or {}).get("size") or 0))  # fmt: skip


def table_lines(rows: list[dict], log_dir: Path | None = None) -> list[str]:
    """The curve's markdown table with its legend (this script's output, docs/results.md's)."""
    depth = max((len(r["accept_at_depth"]) for r in rows), default=0)
    heads = " | ".join(f"P(a>={k})" for k in range(1, depth + 1))
    lines = [
        "steps: the chosen checkpoint's; (epochs the fit ran, what ended it: early = the "
        "early-stopping rule, cap = trainer.max_steps, not converged)",
        "",
        "V_d: the draft vocabulary (its coverage of the held-out answers); train tokens/s: the "
        "median of the run's train/tokens_per_s (csv/metrics.csv), and the precision it trained in",
        "",
        f"| run | answer tokens trained on | V_d (held-out coverage) | train tokens/s (precision) "
        f"| steps | τ | {heads} |",
        "|---|---:|---:|---:|---:|---:|" + "---:|" * depth,
    ]
    for r in rows:
        at = [f"{x:.3f}" for x in r["accept_at_depth"]]
        at += ["-"] * (depth - len(at))
        speed = r.get("train_tokens_per_s")
        if speed is None and log_dir is not None:
            speed = train_speed(log_dir / "train" / r["run"])
        speed = (f"{speed:.0f}" if speed is not None else "-") + f" ({precision_cell(r)})"
        lines.append(f"| {r['run']} | {r['train_answer_tokens']} | {vocab_cell(r)} | {speed} | "
                     f"{steps_cell(r)} | {r['tau']:.3f} | {' | '.join(at)} |")  # fmt: skip
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    if machines:
        lines += ["", f"trained on: {'; '.join(machines)}"]
    return lines


if __name__ == "__main__":
    main()
