"""The decoders' LM-head product on this machine in each form (`drafters.decoding.linears`:
F.linear, W @ x.T, the few-row kernel), by rows (positions projected at once: a step's root,
tree nodes, a drafter block).

    python benchmarks/bench_lm_head.py --threads 1

Shape: SmolLM2-135M's LM head (V=49152, d=576), float32 unless --dtype. Median ms of --iters
calls, the forms interleaved, after a warm-up. Prints a markdown table of every form at every row
count, and the form `project` uses on this machine (`kernel_plan`: measured once per machine and
shape, then read from its cache file), to check that choice.
"""

import argparse
import statistics
import time

import torch
from torch import nn

from drafters.decoding.linears import PRODUCTS, forms_for, kernel_plan, planned_form, project


def median_ms(fns: dict, iters: int) -> dict[str, float]:
    """Median ms of each function, called in turn (load drift hits all alike)."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16, 32])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    head = nn.Linear(args.hidden, args.vocab, bias=False).to(dtype).requires_grad_(False)
    forms = forms_for(head.weight)
    print(f"LM head {args.vocab} x {args.hidden} {args.dtype}, {torch.get_num_threads()} thread(s)")
    print("| rows | " + " | ".join(f"{f} ms" for f in forms) + " | project uses |")
    print("|---:|" + "---:|" * len(forms) + "---|")
    kernel_plan(head.weight)  # measured (or read) before the timings
    tol = 1e-4 if dtype == torch.float32 else 2**-7  # bf16: the sums round once, to 8 bits
    with torch.inference_mode():
        for n in args.rows:
            x = torch.randn(n, args.hidden, dtype=dtype)
            torch.testing.assert_close(project(head, x), head(x), rtol=tol, atol=tol)
            ms = median_ms({f: (lambda f=f, x=x: PRODUCTS[f](x, head.weight)) for f in forms},
                           args.iters)  # fmt: skip
            used = planned_form(head.weight, n)
            print(f"| {n} | " + " | ".join(f"{ms[f]:.1f}" for f in forms) + f" | {used} |")


if __name__ == "__main__":
    main()
