"""Data-scaling curve: held-out acceptance of drafters trained on more and more distilled tokens.

    python benchmarks/data_scaling.py --drafters falcon medusa --tokens 100000 300000 1000000 all

For every drafter and token budget: one `python train.py +experiment=<drafter>_smollm2` run on a
nested subset of at most that many answer tokens (`data.max_train_tokens`; `all` = the whole
corpus), under one budget rule for every run (the experiment's: up to 10 epochs, early stopping
and best.ckpt on val/accept_len_est; extra overrides go to every run alike), exported at its
end (`logs/train/<run>/drafter`). Then the drafter decodes held-out ShareGPT first turns
(the corpus's validation split by conversation id: never trained on, never the evaluation
sets) beside the plain AR loop, greedy, on the drafter's chain of depth --depth; every output
is checked against AR's. Reported per run: answer tokens trained on, τ (bonus included) and the
per-depth acceptance P(a >= d) = share of verification steps that accepted at least d drafted
tokens.

Resumable: a finished run (its `drafter/` exported) is not trained again, an interrupted one
resumes (`ckpt_path=last`), and a decoded run's result (`--out/<run>.json`) is kept.
Hours on one core: pin it (`taskset -c 1`) and run it in the background.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_name(drafter: str, budget: str) -> str:
    return f"scaling_{drafter}_{budget}"


def train(drafter: str, budget: str, args) -> Path:
    """Train (or resume) one run; returns its run folder once its drafter is exported."""
    name = run_name(drafter, budget)
    run_dir = Path(args.log_dir) / "train" / name
    if (run_dir / "drafter" / "config.json").is_file():
        return run_dir
    cmd = [
        sys.executable, "train.py", f"+experiment={drafter}_smollm2", f"run_name={name}",
        f"paths.log_dir={args.log_dir}", "ckpt_path=last", "logger=csv",
        f"data.max_train_tokens={'null' if budget == 'all' else budget}",
        *args.overrides,
    ]  # fmt: skip
    print("[scaling] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
    return run_dir


def decode(run_dir: Path, args, target, prompts: list[dict]) -> dict:
    import torch

    from drafters.decoding import decode_ar
    from drafters.export import load_drafter
    from drafters.speculate import speculative_decode

    d = load_drafter(run_dir / "drafter", target)
    tree = f"chain{args.depth}"
    accept, emitted, forwards = [], 0, 0
    for p in prompts:
        ids = torch.tensor([p["ids"]])
        ref = decode_ar(target, ids, args.max_new_tokens).sequences
        res = speculative_decode(target, d, ids, args.max_new_tokens, gate="none", tree=tree)
        if not torch.equal(res.sequences, ref):
            raise AssertionError(f"{run_dir.name}: output differs from AR on ShareGPT {p['id']}")
        accept += res.accept_lens
        emitted += res.sequences.shape[1] - ids.shape[1] - 1
        forwards += len(res.accept_lens)
    depth = [sum(a >= k for a in accept) / max(len(accept), 1) for k in range(1, args.depth + 1)]
    vocab = run_dir / "draft_vocab.json"
    return {
        "run": run_dir.name,
        "kind": d.kind,
        "train_answer_tokens": json.loads(vocab.read_text())["train_answer_tokens"]
        if vocab.is_file()
        else None,
        "global_step": d.config.get("source", {}).get("global_step"),
        "prompts": len(prompts),
        "tau": emitted / forwards if forwards else None,
        "accept_at_depth": [round(x, 4) for x in depth],
        "tree": tree,
        "lossless": True,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--drafters", nargs="+", default=["falcon", "medusa"])
    p.add_argument("--tokens", nargs="+", default=["100000", "300000", "1000000", "all"])
    p.add_argument("--prompts", type=int, default=20, help="held-out ShareGPT first turns")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--depth", type=int, default=4, help="chain depth decoded (Falcon: k x passes)")
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--log-dir", default=str(ROOT / "logs"))
    p.add_argument("--out", default=str(ROOT / "outputs" / "scaling"))
    p.add_argument("overrides", nargs="*", help="train.py overrides for every run")
    args = p.parse_args()

    from drafters import load_target
    from drafters.eval.tune import validation_prompts

    target = load_target(args.target)
    prompts = validation_prompts(target.tokenizer, args.prompts, 1024, 0.02)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for drafter in args.drafters:
        for budget in args.tokens:
            result_path = out / f"{run_name(drafter, budget)}.json"
            if result_path.is_file():
                rows.append(json.loads(result_path.read_text()))
                continue
            run_dir = train(drafter, budget, args)
            rows.append(decode(run_dir, args, target, prompts))
            result_path.write_text(json.dumps(rows[-1], indent=1))
            print(f"[scaling] {json.dumps(rows[-1])}", flush=True)
    print(f"\n{len(prompts)} held-out ShareGPT first turns, {args.max_new_tokens} new tokens, "
          f"greedy, chain of depth {args.depth}, every output equal to AR's\n")  # fmt: skip
    heads = " | ".join(f"P(a>={k})" for k in range(1, args.depth + 1))
    print(f"| run | answer tokens trained on | steps | τ | {heads} |")
    print("|---|---:|---:|---:|" + "---:|" * args.depth)
    for r in rows:
        depth = " | ".join(f"{x:.3f}" for x in r["accept_at_depth"])
        print(f"| {r['run']} | {r['train_answer_tokens']} | {r['global_step']} | "
              f"{r['tau']:.3f} | {depth} |")  # fmt: skip


if __name__ == "__main__":
    main()
