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


# what says where a run writes or how it reports, not what it trains (dotted config keys)
NOT_TRAINING = (
    "run_name", "run_dir", "paths", "ckpt_path", "logger",
    "trainer.log_every_n_steps", "trainer.enable_progress_bar",
)  # fmt: skip
# keys added to the training config after runs were saved without them, with the value the code
# used before the key existed: a saved run lacking one trained with that value
ADDED_SINCE = {
    ("drafter", "csgd", "own_pass_weight"): 1.0,
    ("drafter", "model", "aux_layers"): None,  # Falcon's only (FALCON_ONLY)
    ("data", "aux_layers"): "${oc.select:drafter.model.aux_layers,null}",
}
FALCON_ONLY = {("drafter", "model", "aux_layers")}


def training_config(experiment: str, overrides: list[str]) -> dict:
    """The train.py config a run composes (interpolations unresolved, as Hydra saves it in the
    run's .hydra/config.yaml), without the keys that do not change training."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("train", overrides=[f"+experiment={experiment}", *overrides])
    return _training_part(OmegaConf.to_container(cfg, resolve=False))


def _training_part(cfg: dict, prefix: str = "") -> dict:
    return {
        k: _training_part(v, f"{prefix}{k}.") if isinstance(v, dict) else v
        for k, v in cfg.items()
        if f"{prefix}{k}" not in NOT_TRAINING
    }


def _saved_config(run_dir: Path) -> dict | None:
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        return None
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    kind = (cfg.get("drafter") or {}).get("kind")
    for (*parents, key), value in ADDED_SINCE.items():
        if (*parents, key) in FALCON_ONLY and kind != "falcon":
            continue
        node = cfg
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(key, value)
    return _training_part(cfg)


def _differences(a, b, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix or "(root)"]
    out = []
    for key in sorted(set(a) | set(b), key=str):
        out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
    return [k.rstrip(".") for k in out]


def train_run(name: str, experiment: str, overrides: list[str], log_dir: str) -> Path:
    """Train (or resume, `ckpt_path=last`) `python train.py +experiment=<experiment>` as run
    `name`; returns its run folder once its drafter is exported (then it is never retrained).

    A finished run under the same log_dir whose saved training config equals this one (the
    same experiment and overrides, whatever its name: the ablation's decode_k2 at 1M tokens is
    the scaling curve's Falcon at 1M) is returned instead of training again. A folder `name`
    that holds a run with other settings is refused, naming them, rather than resumed or
    reused. The config says which corpus folder, not what is in it: after re-distilling the
    corpus, use a new --log-dir."""
    runs = Path(log_dir) / "train"
    run_dir = runs / name
    want = training_config(experiment, [f"paths.log_dir={log_dir}", *overrides])
    have = _saved_config(run_dir)
    if have is not None and have != want:
        diff = ", ".join(_differences(have, want)[:5])
        raise SystemExit(
            f"{run_dir} holds a run with other settings ({diff}); delete that folder, or pass "
            "another --log-dir, to train this one"
        )
    if (run_dir / "drafter" / "config.json").is_file():
        return run_dir
    same = finished_run(want, log_dir)
    if same is not None:
        print(f"[{name}] the same training as {same.name}: reused", flush=True)
        return same
    cmd = [
        sys.executable, "train.py", f"+experiment={experiment}", f"run_name={name}",
        f"paths.log_dir={log_dir}", "ckpt_path=last", "logger=csv", *overrides,
    ]  # fmt: skip
    print(f"[{name}] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
    return run_dir


def finished_run(want: dict, log_dir: str) -> Path | None:
    """A run folder under log_dir/train whose drafter is exported and whose saved training
    config equals `want` (a `training_config`), else None. Links are skipped: they name a run
    that is also there under its own name."""
    runs = Path(log_dir) / "train"
    for other in sorted(runs.glob("*/drafter/config.json")) if runs.is_dir() else []:
        folder = other.parent.parent
        if not folder.is_symlink() and _saved_config(folder) == want:
            return folder
    return None


def decode_heldout(
    run_dir: Path, target, prompts: list[dict], max_new_tokens: int, depth: int
) -> dict:
    """Greedy chain decoding of depth `depth` on every prompt, each output checked against the AR
    loop's. Returns tau (bonus included), accept_at_depth (P(a >= d): the share of verification
    steps that accepted at least d drafted tokens), tau_by_phase (Falcon: {r: tau over steps
    with N mod k = r}), the training steps and answer tokens the run saw, and how its fit ended
    (`fit_end.json`: epochs, ended_by early_stopping | max_steps | max_time | max_epochs)."""
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
    vocab = json.loads(vocab.read_text()) if vocab.is_file() else None
    ended = run_dir / "fit_end.json"
    ended = json.loads(ended.read_text()) if ended.is_file() else {}
    return {
        "run": run_dir.name,
        "kind": d.kind,
        "train_answer_tokens": vocab["train_answer_tokens"] if vocab else None,
        "draft_vocab": {key: vocab.get(key) for key in ("size", "coverage_validation")}
        if vocab and vocab.get("size")
        else None,
        "global_step": d.config.get("source", {}).get("global_step"),
        "train_tokens_per_s": train_speed(run_dir),
        "epochs": ended.get("epochs"),
        "ended_by": ended.get("ended_by"),
        "precision": ended.get("precision"),
        "machine": ended.get("machine"),
        "prompts": len(prompts),
        "tau": emitted / forwards if forwards else None,
        "accept_at_depth": [round(x, 4) for x in at_depth],
        "tau_by_phase": {str(r): round(t / s, 4) if s else None for r, (s, t) in phase.items()}
        if k
        else None,
        "tree": tree,
        "lossless": True,
    }


def train_speed(run_dir: Path) -> float | None:
    """Median `train/tokens_per_s` over a run's logging windows (its csv/metrics.csv), or None."""
    import csv
    import statistics

    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    with open(path) as f:
        speeds = [float(r["train/tokens_per_s"]) for r in csv.DictReader(f)
                  if r.get("train/tokens_per_s")]  # fmt: skip
    return statistics.median(speeds) if speeds else None


def precision_cell(row: dict) -> str:
    """The precision a run trained in, short: fp32, bf16 ('?' for a run finished before
    fit_end.json recorded it)."""
    short = {"32-true": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}
    p = row.get("precision")
    return short.get(p, p) if p else "?"


def steps_cell(row: dict) -> str:
    """The table cell of a run's training: the chosen checkpoint's step, then the epochs the fit
    ran and what ended it ("early" = the early-stopping rule: converged by the budget rule;
    "cap" = trainer.max_steps: not converged; "epochs" = trainer.max_epochs)."""
    short = {"early_stopping": "early", "max_steps": "cap", "max_epochs": "epochs",
             "max_time": "time"}  # fmt: skip
    cell = str(row["global_step"])
    if row.get("ended_by"):
        cell += f" ({row['epochs']} ep, {short.get(row['ended_by'], row['ended_by'])})"
    return cell


def heldout_depths(
    run_dir: Path, target, dataset_dir, cache_dir, max_length: int, val_fraction: float
) -> list[float]:
    """Per-depth top-1 rates of the run's drafter on the validation split of a distilled corpus
    (its offline feature cache): heads, P(head d right); Falcon, as decoded, P(depth d right |
    the depths above right)."""
    from drafters.eval.tune import heldout_batches, topk_accuracy
    from drafters.export import load_drafter
    from drafters.models import aux_layers_of

    d = load_drafter(run_dir / "drafter", target)
    batches = heldout_batches(target, str(dataset_dir), str(cache_dir), max_length, val_fraction,
                              aux_layers_of(d.model))  # fmt: skip
    acc, _ = topk_accuracy(d, target, batches, topk=1)
    return [round(row[0], 4) for row in acc]


def heldout_prompts(target, n: int) -> list[dict]:
    """The first n held-out ShareGPT first turns (at most 1024 prompt tokens)."""
    from drafters.eval.tune import validation_prompts

    return validation_prompts(target.tokenizer, n, 1024, 0.02)


def token_budget(value: str) -> str:
    """argparse type of --tokens: a whole number of answer tokens, or `all` (the whole corpus).
    Catches a train.py override swallowed by `--tokens N ...` (nargs='+' takes every word)."""
    if value == "all" or value.isdigit():
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a token budget (a whole number or 'all'); to pass train.py overrides "
        "after --tokens, separate them with --: --tokens 100000 -- data.features=offline"
    )


def add_run_args(p: argparse.ArgumentParser, out: str, record: bool = False) -> None:
    """The options every held-out comparison script shares. `record`: the per-run results go to
    benchmarks/records/<out>/ (committed: a row that took hours of training survives the machine,
    and a re-run on a fresh clone prints it without training again), else outputs/<out>/."""
    p.add_argument("--prompts", type=int, default=20, help="held-out ShareGPT first turns")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--log-dir", default=str(ROOT / "logs"))
    where = ROOT / "benchmarks" / "records" if record else ROOT / "outputs"
    p.add_argument("--out", default=str(where / out))
    p.add_argument("overrides", nargs="*", help="train.py overrides for every run")


def start(args) -> tuple:
    """(target, held-out prompts, the output folder, made) for parsed `add_run_args` options."""
    from drafters import load_target

    target = load_target(args.target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return target, heldout_prompts(target, args.prompts), out


def main() -> None:
    """`python benchmarks/heldout.py finished EXPERIMENT [OVERRIDES...]`: print the folder of a
    finished run with that training config (results.sh reuses it), or nothing."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("command", choices=["finished"])
    p.add_argument("experiment")
    p.add_argument("--log-dir", default=str(ROOT / "logs"))
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    want = training_config(args.experiment, [f"paths.log_dir={args.log_dir}", *args.overrides])
    same = finished_run(want, args.log_dir)
    if same is not None:
        print(same)


if __name__ == "__main__":
    main()
