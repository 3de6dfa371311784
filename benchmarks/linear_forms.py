"""What the forms of the decoders' linears (`drafters.decoding.linears`: F.linear, W @ x.T, the
few-row kernel, and the plan measured per weight shape and row count) do to the target's forward
cost by rows verified, t(n), in one process, the arms interleaved round by round so that load
drift falls on all.

    python benchmarks/linear_forms.py                    # SmolLM2 fp32, 1 thread, 1..16 rows
    python benchmarks/linear_forms.py --threads 2 --rounds 5 --arms linear measured
    python benchmarks/linear_forms.py --dtype bfloat16 --arms linear mm small measured

t(n) = the median time of a target forward over n new tokens with a tree mask plus its LM head
(`drafters.decoding.cost.forward_seconds`), on a random 128-token context; each cell the
minimum over rounds (the least disturbed). A tree step verifying n rows pays off only when τ
exceeds about t(n) / t(1) plain steps (of the linear arm: HF's), so the last columns are the
break-even τ floor.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from drafters import load_target
from drafters.decoding.cost import forward_seconds
from drafters.decoding.linears import FORMS, kernel_plan
from drafters.machine import describe

ARMS = (*FORMS, "measured")  # one form for every linear and row count, or the measured plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default=None, help="float32 (default) or bfloat16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=["linear", "small", "measured"])
    args = p.parse_args()
    arms = ["linear", *[a for a in args.arms if a != "linear"]]  # the baseline first
    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype)
    os.environ.pop("DRAFTERS_LINEAR_FORMS", None)
    weights = {tuple(m.weight.shape): m.weight for m in target.model.modules()
               if isinstance(m, torch.nn.Linear)}  # fmt: skip
    t0 = time.perf_counter()
    for w in weights.values():  # what a decoder's first call pays, unless the file has them
        kernel_plan(w)
    print(f"kernel plans of the target's {len(weights)} weight shapes: "
          f"{time.perf_counter() - t0:.1f} s (~0 when read from the cache file)")  # fmt: skip
    runs: dict[str, list[list[float]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            if arm == "measured":
                os.environ.pop("DRAFTERS_LINEAR_FORMS", None)
            else:
                os.environ["DRAFTERS_LINEAR_FORMS"] = arm
            runs[arm].append(forward_seconds(target, args.rows))
    os.environ.pop("DRAFTERS_LINEAR_FORMS", None)
    best = {a: [min(col) for col in zip(*rs, strict=True)] for a, rs in runs.items()}
    base = best["linear"][0]
    print(f"\n{target.name}, {target.dtype}, {args.threads} thread(s), {describe()}; "
          f"min over {args.rounds} interleaved rounds\n")  # fmt: skip
    print("| rows n | " + " | ".join(f"{a} t(n) ms" for a in arms) + " | "
          + " | ".join(f"{a} t(n) / linear t(1)" for a in arms) + " |")  # fmt: skip
    print("|---:|" + "---:|" * (2 * len(arms)))
    for n in range(1, args.rows + 1):
        ms = " | ".join(f"{best[a][n - 1] * 1e3:.1f}" for a in arms)
        ratio = " | ".join(f"{best[a][n - 1] / base:.2f}" for a in arms)
        print(f"| {n} | {ms} | {ratio} |")


if __name__ == "__main__":
    main()
