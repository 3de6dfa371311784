"""Training throughput (tokens/s) and peak memory per drafter, by feature mode, precision and
draft vocabulary.

    python benchmarks/bench_train.py --steps 20 --drafters falcon cerberus medusa
    python benchmarks/bench_train.py --modes offline --vocab full 8192 --precision 32-true \
        --threads 1 data.dataset_dir=data/distilled/snap2/train data.cache_dir=data/features/snap2

Each configuration is a real `python train.py` run (embedded SmolLM2 target, distilled data,
CSV logger) in its own process, so the peak resident memory (from wait4) is that run's alone.
tokens/s is the mean of `train/tokens_per_s` (all tokens of a batch, prompt and answer, per
second of whole training iterations, averaged over each window of --log-every steps, so steps
that skip the accuracy metrics count) after the first `--skip` windows. Offline runs build the
feature cache first (`python data/cache_features.py`) if it is missing. Prints a markdown table.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], env: dict) -> tuple[int, int]:
    """Run a command; returns (exit code, peak RSS in MiB) of that process tree's main process."""
    proc = subprocess.Popen(args, cwd=ROOT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss // 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--drafters", nargs="+", default=["falcon", "cerberus", "medusa"])
    p.add_argument("--modes", nargs="+", default=["online", "offline"])
    p.add_argument("--steps", type=int, default=25)
    p.add_argument(
        "--log-every", type=int, default=5, help="trainer.log_every_n_steps: tokens/s windows"
    )
    p.add_argument("--skip", type=int, default=1, help="warm-up windows left out of the mean")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--vocab", nargs="+", default=["8192"], help="draft vocabulary sizes; 'full': the target's"
    )
    p.add_argument(
        "--precision",
        nargs="+",
        default=["32-true"],
        help="Lightning precisions (32-true, bf16-mixed, auto)",
    )
    p.add_argument(
        "--extra",
        nargs="*",
        default=[],
        metavar="DRAFTER:OVERRIDE",
        help="an extra row: e.g. falcon:drafter.csgd.teacher_forcing_only=true",
    )
    p.add_argument("overrides", nargs="*", help="extra train.py overrides")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "WANDB_MODE": "disabled"}
    logs = Path(tempfile.mkdtemp(prefix="bench_train_"))
    rows = []
    for mode in args.modes:
        if mode == "offline":
            rc, _ = run([sys.executable, "data/cache_features.py", *args.overrides], env)
            if rc:
                sys.exit(f"building the feature cache failed ({rc})")
        jobs = [(d, None) for d in args.drafters]
        jobs += [tuple(e.split(":", 1)) for e in args.extra]
        for drafter, extra in jobs:
            for precision in args.precision:
                for vocab in args.vocab:
                    size = "null" if vocab == "full" else vocab
                    name = f"{drafter}_{mode}_{precision}_{vocab}" + ("_x" if extra else "")
                    cmd = [
                        sys.executable,
                        "train.py",
                        f"+experiment={drafter}_smollm2",
                        "logger=csv",
                        f"run_name=bench_{name}",
                        f"paths.log_dir={logs}",
                        f"data.features={mode}",
                        f"trainer.max_steps={args.steps}",
                        f"trainer.precision={precision}",
                        f"drafter.model.draft_vocab_size={size}",
                        "trainer.val_check_interval=1000000",
                        "trainer.limit_val_batches=0",
                        f"trainer.log_every_n_steps={args.log_every}",
                        "callbacks.checkpoint.every_n_train_steps=1000000",
                        *([extra] if extra else []),
                        *args.overrides,
                    ]
                    rc, peak = run(cmd, env)
                    if rc:
                        sys.exit(f"{name} failed ({rc})")
                    with open(logs / "train" / f"bench_{name}" / "csv" / "metrics.csv") as f:
                        tps = [
                            float(r["train/tokens_per_s"])
                            for r in csv.DictReader(f)
                            if r.get("train/tokens_per_s")
                        ]
                    kept = tps[args.skip :] or tps
                    label = drafter + (f" ({extra})" if extra else "")
                    rows.append((label, mode, precision, vocab, sum(kept) / len(kept), peak))
                    print(f"{name}: {rows[-1][4]:.0f} tokens/s, peak {peak} MiB", flush=True)
    print(
        f"\nSmolLM2-135M target, {args.threads} threads, {args.steps} steps "
        f"(windows of {args.log_every}, first {args.skip} left out), "
        f"overrides: {' '.join(args.overrides) or 'none'}\n"
    )
    print("| drafter | features | precision | draft vocabulary | tokens/s | peak RSS (MiB) |")
    print("|---|---|---|---|---:|---:|")
    for drafter, mode, precision, vocab, tps, peak in rows:
        print(f"| {drafter} | {mode} | {precision} | {vocab} | {tps:.0f} | {peak} |")


if __name__ == "__main__":
    main()
