"""Logits of a few positions at a time, the decoders' LM-head product, in the form this machine
runs fastest.

For a handful of rows x against a large W (an LM head: vocabulary x hidden), `x @ W.T`
(`F.linear`) and `W @ x.T` take different CPU kernels: on some processors the first runs a
matrix-vector product per row (one full pass over W each), on others the second is the slow one,
and the crossover moves with the row count, the dtype and the head's shape (a row range tuned
on one machine of this kind was wrong on another). So the choice is measured where the decoder
runs: the first `project` on a CPU head of a given shape and dtype times both forms for
1 .. MAX_ROWS rows (`kernel_plan`; about a second for a 49,152-row head) and keeps the faster
per row count, in
memory and in a JSON file per machine (`$DRAFTERS_KERNEL_CACHE`, default
`~/.cache/drafters/kernels.json`, keyed by processor, torch version, threads, dtype and shape),
so later processes reuse it. More rows, and other devices, use `F.linear`. Values equal `head(x)`
up to float summation order (`python benchmarks/bench_lm_head.py` prints both forms).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from drafters.machine import processor_name

MAX_ROWS = 16  # row counts measured; the decoders project 1 .. ~16 positions a call
_PLANS: dict[str, tuple[bool, ...]] = {}  # key -> use W @ x.T for rows 1..MAX_ROWS


def project(head: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """head(x) for x (..., d) -> (..., V), in the measured fastest form for its row count."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or not 1 <= rows <= MAX_ROWS:
        return head(x)
    if not kernel_plan(head.weight)[rows - 1]:
        return head(x)
    out = torch.mm(head.weight, x.reshape(rows, x.shape[-1]).to(head.weight.dtype).t()).t()
    if head.bias is not None:
        out = out + head.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _key(weight: torch.Tensor) -> str:
    V, d = weight.shape
    return (f"{processor_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"{weight.dtype} | {V}x{d}")  # fmt: skip


def _cache_file() -> Path:
    return Path(os.environ.get("DRAFTERS_KERNEL_CACHE",
                               Path.home() / ".cache" / "drafters" / "kernels.json"))  # fmt: skip


def _read_file() -> dict:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}  # absent or unreadable: measure again


def _write_file(key: str, plan: tuple[bool, ...]) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_file()
        data[key] = ["mm" if p else "linear" for p in plan]
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: the plan stays in memory for this process


def measure_plan(weight: torch.Tensor, reps: int = 3) -> tuple[bool, ...]:
    """For rows 1..MAX_ROWS: whether `W @ x.T` beats `F.linear` (median of `reps`, the two forms
    interleaved so load drift hits both alike)."""
    d = weight.shape[1]
    plan = []
    with torch.inference_mode():
        for rows in range(1, MAX_ROWS + 1):
            x = torch.randn(rows, d, dtype=weight.dtype)
            times: list[list[float]] = [[], []]
            for i in range(reps + 1):
                for mm, t in zip((False, True), times, strict=True):
                    t0 = time.perf_counter()
                    torch.mm(weight, x.t()) if mm else torch.nn.functional.linear(x, weight)
                    if i:  # the first round warms up
                        t.append(time.perf_counter() - t0)
            plan.append(statistics.median(times[1]) < statistics.median(times[0]))
    return tuple(plan)


def kernel_plan(weight: torch.Tensor) -> tuple[bool, ...]:
    """The measured plan for this head on this machine (in memory, else the file, else timed)."""
    key = _key(weight)
    plan = _PLANS.get(key)
    if plan is None:
        stored = _read_file().get(key)
        if isinstance(stored, list) and len(stored) == MAX_ROWS:
            plan = tuple(p == "mm" for p in stored)
        else:
            plan = measure_plan(weight)
            _write_file(key, plan)
        _PLANS[key] = plan
    return plan
