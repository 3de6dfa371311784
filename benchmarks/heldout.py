"""Shared by the held-out comparison scripts (data_scaling.py, falcon_ablation.py): train a named
run under the experiment's budget rule, resumably, and decode held-out ShareGPT first turns with
its exported drafter beside the plain AR loop.

Held-out prompts: the first user turns of ShareGPT's validation split by conversation id (never
distilled, never trained on, never the evaluation sets), as `drafters-tune` uses.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train_run(name: str, experiment: str, overrides: list[str], log_dir: str) -> Path:
    """Train (or resume, `ckpt_path=last`) `python train.py +experiment=<experiment>` as run
    `name`; returns its run folder once its drafter is exported (then it is never retrained)."""
    run_dir = Path(log_dir) / "train" / name
    if (run_dir / "drafter" / "config.json").is_file():
        return run_dir
    cmd = [
        sys.executable, "train.py", f"+experiment={experiment}", f"run_name={name}",
        f"paths.log_dir={log_dir}", "ckpt_path=last", "logger=csv", *overrides,
    ]  # fmt: skip
    print(f"[{name}] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
    return run_dir


def decode_heldout(
    run_dir: Path, target, prompts: list[dict], max_new_tokens: int, depth: int
) -> dict:
    """Greedy chain decoding of depth `depth` on every prompt, each output checked against the AR
    loop's. Returns tau (bonus included), accept_at_depth (P(a >= d): the share of verification
    steps that accepted at least d drafted tokens), tau_by_phase (Falcon: {r: tau over steps
    with N mod k = r}), the training steps and answer tokens the run saw."""
    import torch

    from drafters.decoding import decode_ar
    from drafters.export import load_drafter
    from drafters.speculate import speculative_decode

    d = load_drafter(run_dir / "drafter", target)
    tree = f"chain{depth}"
    k = d.model.cfg.k if d.kind == "falcon" else None
    accept, emitted, forwards = [], 0, 0
    phase = {r: [0, 0] for r in range(k or 0)}  # steps, tokens
    for p in prompts:
        ids = torch.tensor([p["ids"]])
        ref = decode_ar(target, ids, max_new_tokens).sequences
        res = speculative_decode(target, d, ids, max_new_tokens, gate="none", tree=tree)
        if not torch.equal(res.sequences, ref):
            raise AssertionError(f"{run_dir.name}: output differs from AR on ShareGPT {p['id']}")
        accept += res.accept_lens
        emitted += res.new_tokens - 1
        forwards += res.verify_forwards
        for r, c in (res.tau_by_phase(k) if k else {}).items():
            phase[r][0] += c["steps"]
            phase[r][1] += c["tokens"]
    at_depth = [sum(a >= i for a in accept) / max(len(accept), 1) for i in range(1, depth + 1)]
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
        "accept_at_depth": [round(x, 4) for x in at_depth],
        "tau_by_phase": {str(r): round(t / s, 4) if s else None for r, (s, t) in phase.items()}
        if k
        else None,
        "tree": tree,
        "lossless": True,
    }


def heldout_depths(
    run_dir: Path, target, dataset_dir, cache_dir, max_length: int, val_fraction: float
) -> list[float]:
    """Per-depth top-1 rates of the run's drafter on the validation split of a distilled corpus
    (its offline feature cache): heads, P(head d right); Falcon, as decoded, P(depth d right |
    the depths above right)."""
    from drafters.eval.tune import heldout_batches, topk_accuracy
    from drafters.export import load_drafter

    d = load_drafter(run_dir / "drafter", target)
    batches = heldout_batches(target, str(dataset_dir), str(cache_dir), max_length, val_fraction)
    acc, _ = topk_accuracy(d, target, batches, topk=1)
    return [round(row[0], 4) for row in acc]


def heldout_prompts(target, n: int) -> list[dict]:
    """The first n held-out ShareGPT first turns (at most 1024 prompt tokens)."""
    from drafters.eval.tune import validation_prompts

    return validation_prompts(target.tokenizer, n, 1024, 0.02)


def add_run_args(p: argparse.ArgumentParser, out: str) -> None:
    """The options every held-out comparison script shares."""
    p.add_argument("--prompts", type=int, default=20, help="held-out ShareGPT first turns")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--log-dir", default=str(ROOT / "logs"))
    p.add_argument("--out", default=str(ROOT / "outputs" / out))
    p.add_argument("overrides", nargs="*", help="train.py overrides for every run")


def start(args) -> tuple:
    """(target, held-out prompts, the output folder, made) for parsed `add_run_args` options."""
    from drafters import load_target

    target = load_target(args.target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return target, heldout_prompts(target, args.prompts), out
