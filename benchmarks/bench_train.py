"""Training throughput (tokens/s) and peak memory per drafter, online vs offline features.

    python benchmarks/bench_train.py --steps 20 --drafters falcon cerberus medusa

Each configuration is a real `python train.py` run (embedded SmolLM2 target, distilled data,
CSV logger) in its own process, so the peak resident memory (from wait4) is that run's alone.
tokens/s is the mean of `train/tokens_per_s` (all tokens of a batch, prompt and answer, per
second of training step) after the first `--skip` steps. Offline runs build the feature cache
first (`python data/cache_features.py`) if it is missing. Prints a markdown table.
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
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the mean")
    p.add_argument("--threads", type=int, default=2)
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
        for drafter in args.drafters:
            name = f"{drafter}_{mode}"
            cmd = [
                sys.executable,
                "train.py",
                f"+experiment={drafter}_smollm2",
                "logger=csv",
                f"run_name=bench_{name}",
                f"paths.log_dir={logs}",
                f"data.features={mode}",
                f"trainer.max_steps={args.steps}",
                "trainer.val_check_interval=1000000",
                "trainer.limit_val_batches=0",
                "trainer.log_every_n_steps=1",
                "callbacks.checkpoint.every_n_train_steps=1000000",
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
            rows.append((drafter, mode, sum(kept) / len(kept), peak))
            print(f"{name}: {rows[-1][2]:.0f} tokens/s, peak {peak} MiB", flush=True)
    print(
        f"\nSmolLM2-135M target, {args.threads} threads, {args.steps} steps "
        f"(first {args.skip} left out), overrides: {' '.join(args.overrides) or 'none'}\n"
    )
    print("| drafter | features | tokens/s | peak RSS (MiB) |")
    print("|---|---|---:|---:|")
    for drafter, mode, tps, peak in rows:
        print(f"| {drafter} | {mode} | {tps:.0f} | {peak} |")


if __name__ == "__main__":
    main()
