"""The decoders' LM-head product on this machine: `head(x)` against `project(head, x)` (W @ x.T),
by rows (positions projected at once: a step's root, tree nodes, a drafter block).

    python benchmarks/bench_lm_head.py --threads 1

Shape: SmolLM2-135M's LM head (V=49152, d=576), float32 unless --dtype. Median ms of --iters
calls, interleaved, after a warm-up. Prints a markdown table of both products at every row count,
and the form `project` uses on this machine (`drafters.decoding.logits.kernel_plan`: measured
once per machine and shape, then read from its cache file), to check that choice.
"""

import argparse
import statistics
import time

import torch
from torch import nn

from drafters.decoding.logits import MAX_ROWS, kernel_plan, project


def median_ms(f, g, iters: int) -> tuple[float, float]:
    """Median ms of f and of g, called alternately (load drift hits both alike)."""
    f(), g()
    tf, tg = [], []
    for _ in range(iters):
        for fn, times in ((f, tf), (g, tg)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(tf), 1000 * statistics.median(tg)


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
    print(f"LM head {args.vocab} x {args.hidden} {args.dtype}, {torch.get_num_threads()} thread(s)")
    print("| rows | head(x) ms | W @ x.T ms | ratio | project uses |")
    print("|---:|---:|---:|---:|---|")
    plan = kernel_plan(head.weight)
    for n in args.rows:
        x = torch.randn(n, args.hidden, dtype=dtype)
        torch.testing.assert_close(project(head, x), head(x), rtol=1e-4, atol=1e-4)
        a, b = median_ms(
            lambda x=x: head(x), lambda x=x: torch.mm(head.weight, x.t()).t(), args.iters
        )
        used = "W @ x.T" if n <= MAX_ROWS and plan[n - 1] else "head(x)"
        print(f"| {n} | {a:.1f} | {b:.1f} | {a / b:.2f} | {used} |")


if __name__ == "__main__":
    main()
