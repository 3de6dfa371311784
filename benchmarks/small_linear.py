"""What the few-row linear kernel (drafters/kernels/small_linear.py) does to the target's forward
cost by rows verified, t(n), against the stock `F.linear` (BLAS), in one process, the two arms
interleaved round by round so that load drift falls on both.

    python benchmarks/small_linear.py                    # SmolLM2 fp32, 1 thread, 1..16 rows
    python benchmarks/small_linear.py --threads 2 --rounds 5

t(n) = the median time of a target forward over n new tokens with a tree mask plus its LM head
(`drafters.decoding.cost.forward_seconds`), on a random 128-token context; each cell the
minimum over rounds (the least disturbed). A tree step verifying n rows pays off only when τ
exceeds about t(n) / t(1) plain steps, so the ratio columns are the break-even τ floor.
"""

from __future__ import annotations

import argparse

import torch

from drafters import load_target
from drafters.decoding.cost import forward_seconds
from drafters.kernels.small_linear import use_small_linear
from drafters.machine import describe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    arms: dict[str, list[list[float]]] = {"F.linear": [], "small_linear": []}
    for r in range(args.rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            if name == "small_linear":
                with use_small_linear(target.model, max_rows=args.rows):
                    arms[name].append(forward_seconds(target, args.rows))
            else:
                arms[name].append(forward_seconds(target, args.rows))
    best = {name: [min(col) for col in zip(*runs, strict=True)] for name, runs in arms.items()}
    base = best["F.linear"][0]
    print(f"\n{target.name}, {target.dtype}, {args.threads} thread(s), {describe()}; "
          f"min over {args.rounds} interleaved rounds\n")  # fmt: skip
    print("| rows n | F.linear t(n) ms | t(n) / t(1) | small_linear t(n) ms | t(n) / its t(1) "
          "| t(n) / F.linear t(1) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for n in range(1, args.rows + 1):
        a, b = best["F.linear"][n - 1], best["small_linear"][n - 1]
        print(f"| {n} | {a * 1e3:.1f} | {a / base:.2f} | {b * 1e3:.1f} | "
              f"{b / best['small_linear'][0]:.2f} | {b / base:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
