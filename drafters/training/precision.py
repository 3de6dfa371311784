"""`trainer.precision: auto` on the CPU: bf16 autocast where it is faster on this processor.

Whether bf16 autocast pays on a CPU depends on the processor (native bf16 dot products, AMX) and
on the kernels torch picks for it, so it is measured where the run starts, never assumed: a
drafter-shaped step (rows x d against a d x V_d head, forward and backward) is timed in float32
and under `torch.autocast("cpu", torch.bfloat16)`, and bf16 is chosen when it is at least
`MARGIN` faster. About a second, once per process. Other accelerators: auto means "bf16-mixed"
where the device supports bf16 (Lightning's own check happens when the Trainer starts).
"""

from __future__ import annotations

import time
from functools import cache

import torch

MARGIN = 1.15  # bf16 must be this much faster to be chosen (timing noise, cast overheads)
SHAPE = (256, 576, 2048)  # rows, hidden size, head rows: ~40 ms fp32 on one core


def _step_seconds(x: torch.Tensor, w: torch.Tensor, bf16: bool, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = x @ w
            loss = y.float().logsumexp(-1).mean()
        loss.backward()
        times.append(time.perf_counter() - t0)
    return min(times)


@cache
def measure_cpu_bf16(reps: int = 5) -> dict:
    """Seconds per drafter-shaped step in float32 and in bf16 autocast on this CPU (best of
    `reps`; bf16 is timed once only when that once is already far slower, as on processors
    without native bf16, where it can be 40x slower). bf16's first call sets its kernels up
    (oneDNN) and is never the timed one: on a busy Zen 4 it alone took 5x a step and flipped the
    choice to fp32 where bf16 is 2.6x faster."""
    rows, d, v = SHAPE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=g).requires_grad_(True)
    w = (torch.randn(d, v, generator=g) * d**-0.5).requires_grad_(True)
    _step_seconds(x, w, False, 1)  # warm up
    fp32 = _step_seconds(x, w, False, reps)
    _step_seconds(x, w, True, 1)  # kernel setup
    bf16 = _step_seconds(x, w, True, 1)
    if bf16 < 2 * fp32:
        bf16 = _step_seconds(x, w, True, reps)
    return {"fp32_s": round(fp32, 5), "bf16_s": round(bf16, 5), "speedup": round(fp32 / bf16, 2)}


def auto_precision(accelerator: str = "cpu") -> str:
    """The Lightning precision string for `trainer.precision: auto`."""
    if accelerator != "cpu":
        if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
            return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
        return "32-true"
    m = measure_cpu_bf16()
    choice = "bf16-mixed" if m["speedup"] >= MARGIN else "32-true"
    print(
        f"[train] trainer.precision=auto on this CPU: {choice} (drafter-shaped step: fp32 "
        f"{m['fp32_s'] * 1e3:.0f} ms, bf16 autocast {m['bf16_s'] * 1e3:.0f} ms, x{m['speedup']}; "
        f"bf16 needs x{MARGIN})",
        flush=True,
    )
    return choice


def resolve_precision(precision, accelerator: str = "cpu"):
    """`auto` -> a measured choice; anything else is Lightning's own value, unchanged."""
    return auto_precision(str(accelerator)) if str(precision) == "auto" else precision
