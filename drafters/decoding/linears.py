"""The decoders' linear layers, each run in the form this machine runs fastest for its row count.

At decode time every linear (the target's projections and LM head, a drafter's layers and heads)
sees 1 .. ~16 rows: an AR step's token, a tree's nodes, a drafter block. There the stock kernels
are far from the weight-traffic bound, and which of the forms below is fastest depends on the
processor, the threads, the dtype, the weight's shape and the row count (the row range tuned for
the LM head on one machine of a kind was wrong on another, and a 4-row verify of SmolLM2 cost
1.39 one-row steps with `F.linear` where the weight traffic says ~1.0):

- "linear": `F.linear(x, W)`, what `nn.Linear` runs;
- "mm": `(W @ x.T).T`, another BLAS kernel (a matrix-vector product per row on some processors);
- "small": the few-row kernel of `drafters.kernels.small_linear` (float32 or bfloat16; one pass
  over the weights for all rows, batch-invariant), where it builds on this machine. It reads a
  packed copy of the weight, made on its first call and kept while the weight lives: the linears the
  plan gives it hold their weights twice (SmolLM2: +0.54 GB in fp32, +0.27 GB in bf16).

So the choice is measured where the decoder runs: the first call on a CPU weight of a given shape
and dtype times every form for the row counts of PLAN_ROWS (1 .. 16 each, then every 4th to
MAX_ROWS; a count between two is run as the next one up was) on cold weights, as a forward
meets them (`kernel_plan`; measured for SmolLM2's shapes in the README) and keeps the fastest
per row count, in memory and in a JSON file per machine (`$DRAFTERS_KERNEL_CACHE`, default
`~/.cache/drafters/kernels.json`, keyed by processor, torch version, threads, dtype, shape and the
forms compared), so later processes reuse it. More rows, other devices, autograd and autocast
use `F.linear`. Values equal `F.linear` up to float summation order.

`project(head, x)` is one such product; `@fitted` runs a whole decoder so: while it runs, every
`nn.Linear` of its target and drafter modules takes the measured form, and outside it (HF
`generate`, the benchmark's baseline; training) the modules are stock. `$DRAFTERS_LINEAR_FORMS`
(e.g. `linear` or `linear,mm`) restricts the forms compared, for before/after measurements.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from drafters.kernels.small_linear import (
    available,
    build_name,
    packed,
    packed_product,
    small_linear,
)
from drafters.machine import last_level_cache_bytes, processor_name

# the row counts timed: the decoders run 1 .. ~33 rows a call (an AR step, a tree's nodes + 1)
PLAN_ROWS = (*range(1, 17), 20, 24, 28, 32)
MAX_ROWS = PLAN_ROWS[-1]
_SLOT = [0] + [bisect.bisect_left(PLAN_ROWS, r) for r in range(1, MAX_ROWS + 1)]  # rows -> entry
FORMS = ("linear", "mm", "small")
_PLANS: dict[tuple, tuple[str, ...]] = {}  # _memory_key -> the form for each of PLAN_ROWS
_WARNED: set[str] = set()


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(w, x.t()).t()


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


# form -> x (rows, d) @ w.T; the kernel's module builds on its first call, not on import
PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": _linear, "mm": _mm, "small": small_linear}  # fmt: skip


def forms_for(weight: torch.Tensor) -> tuple[str, ...]:
    """The forms compared for this weight here: FORMS (or $DRAFTERS_LINEAR_FORMS), "small" only
    for float32 and bfloat16 and where the kernel builds (if it does not, said once on stderr)."""
    wanted = os.environ.get("DRAFTERS_LINEAR_FORMS")
    forms = tuple(f.strip() for f in wanted.split(",") if f.strip()) if wanted else FORMS
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        raise ValueError(f"DRAFTERS_LINEAR_FORMS={wanted!r}: use a comma list of {FORMS}")
    if "small" in forms:
        if weight.dtype not in (torch.float32, torch.bfloat16):
            forms = tuple(f for f in forms if f != "small")
        else:
            ok, why = available()
            if not ok:
                if why not in _WARNED:
                    _WARNED.add(why)
                    print(f"[drafters] the few-row linear kernel did not build here ({why}); "
                          "the decoders compare the BLAS forms only", flush=True)  # fmt: skip
                forms = tuple(f for f in forms if f != "small")
    return forms or ("linear",)


def _stock(x: torch.Tensor, weight: torch.Tensor, rows: int) -> bool:
    """Whether this product stays `F.linear`: another device, a row count past the plan, mixed
    dtypes, autograd or autocast."""
    return (x.device.type != "cpu" or not 1 <= rows <= MAX_ROWS or x.dtype != weight.dtype
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            or torch.is_autocast_enabled("cpu"))  # fmt: skip


def rows_product(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """x (..., d) @ weight.T (+ bias) in the measured fastest form for its row count."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if _stock(x, weight, rows):
        return F.linear(x, weight, bias)
    form = planned_form(weight, rows)
    out = PRODUCTS[form](x.reshape(rows, x.shape[-1]), weight)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def planned_form(weight: torch.Tensor, rows: int) -> str:
    """The form the plan runs `rows` rows of x against this weight in ("linear" past MAX_ROWS)."""
    return kernel_plan(weight)[_SLOT[rows]] if 1 <= rows <= MAX_ROWS else "linear"


def project(head: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """head(x) for x (..., d) -> (..., V), in the measured fastest form for its row count."""
    if x.device.type == "cpu" and x.dtype != head.weight.dtype:
        x = x.to(head.weight.dtype)
    return rows_product(head.weight, head.bias, x)


class fit_linears:
    """Within the block, every `nn.Linear` of `modules` runs `rows_product` (the measured form
    per row count); on exit they are stock again. Re-entrant: a linear already fitted by an
    outer block is left to it."""

    def __init__(self, *modules: nn.Module | None):
        seen: dict[int, nn.Linear] = {}
        for module in modules:
            if isinstance(module, nn.Module):
                for m in module.modules():
                    if isinstance(m, nn.Linear):
                        seen.setdefault(id(m), m)
        self.linears = list(seen.values())
        self.mine: list[nn.Linear] = []

    def __enter__(self):
        for m in self.linears:
            if "forward" not in vars(m):  # not fitted by an outer block (nor patched by others)
                m.forward = _FittedLinear(m)
                self.mine.append(m)
        return self

    def __exit__(self, *exc):
        for m in self.mine:
            del m.forward  # back to the class's forward
        self.mine = []
        return False


class _FittedLinear:
    """A fitted module's forward: `rows_product` with what it looks up per call (the plan, the
    packed weight) kept for the block, which runs one decoder call (the weights, the threads and
    $DRAFTERS_LINEAR_FORMS do not change inside it). The per-call lookups cost ~10 us a linear,
    ~2 ms of a 25-40 ms SmolLM2 forward."""

    __slots__ = ("weight", "bias", "n", "plan", "wp")

    def __init__(self, m: nn.Linear):
        self.weight, self.bias, self.n = m.weight, m.bias, m.weight.shape[0]
        self.plan: tuple[str, ...] | None = None  # on the first call (it may be measured)
        self.wp: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        rows = x.numel() // d if d else 0
        if _stock(x, self.weight, rows):
            return F.linear(x, self.weight, self.bias)
        if self.plan is None:
            self.plan = kernel_plan(self.weight)
        form = self.plan[_SLOT[rows]]
        if form == "small":
            if self.wp is None:
                self.wp = packed(self.weight)
            out = packed_product(x.reshape(rows, d), self.wp, self.n)
        else:
            out = PRODUCTS[form](x.reshape(rows, d), self.weight)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.n)


def fitted(decoder: Callable) -> Callable:
    """Decorator of a decoder `f(target, ...)`: while it runs, the linears of `target.model` and
    of every `nn.Module` among its other arguments (drafter, gate) are fitted (`fit_linears`)."""

    @functools.wraps(decoder)
    def run(target, *args, **kwargs):
        modules = [a for a in (*args, *kwargs.values()) if isinstance(a, nn.Module)]
        with fit_linears(target.model, *modules):
            return decoder(target, *args, **kwargs)

    return run


def _key(weight: torch.Tensor, forms: Iterable[str]) -> str:
    N, d = weight.shape
    kernel = f" | {build_name()}" if "small" in forms else ""  # an edited kernel is timed anew
    return (f"{processor_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"{weight.dtype} | {N}x{d} | {','.join(forms)}{kernel}")  # fmt: skip


def _cache_file() -> Path:
    return Path(os.environ.get("DRAFTERS_KERNEL_CACHE",
                               Path.home() / ".cache" / "drafters" / "kernels.json"))  # fmt: skip


def _read_file() -> dict:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}  # absent or unreadable: measure again


def _write_file(key: str, plan: tuple[str, ...]) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_file()
        data[key] = list(plan)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: the plan stays in memory for this process


def measure_plan(weight: torch.Tensor, forms: tuple[str, ...], reps: int = 3) -> tuple[str, ...]:
    """For each row count of PLAN_ROWS: the fastest of `forms` (median of `reps` samples, the forms
    interleaved so that load drift hits all alike). The weights are timed cold, as a forward
    meets them (each linear's weights were evicted by the other layers' since its last call): a
    sample runs once over enough copies of the weight to overflow twice the last-level cache,
    else a small projection would be timed from L2 where the kernels rank differently."""
    if len(forms) == 1:
        return forms * len(PLAN_ROWS)
    d = weight.shape[1]
    size = weight.numel() * weight.element_size()
    n = max(1, min(256, math.ceil(2 * last_level_cache_bytes() / size)))
    copies = [weight] + [weight.clone() for _ in range(n - 1)]
    plan = []
    with torch.inference_mode():
        x1 = torch.randn(1, d, dtype=weight.dtype)
        for f in forms:
            PRODUCTS[f](x1, weight)  # first calls: allocations, the kernel's load
        for rows in PLAN_ROWS:
            x = torch.randn(rows, d, dtype=weight.dtype)
            times: dict[str, list[float]] = {f: [] for f in forms}
            for i in range(reps + 1):
                for f in forms:
                    run = PRODUCTS[f]
                    t0 = time.perf_counter()
                    for w in copies:
                        run(x, w)
                    if i:  # the first round warms up
                        times[f].append(time.perf_counter() - t0)
            plan.append(min(forms, key=lambda f: statistics.median(times[f])))
    return tuple(plan)


def _memory_key(weight: torch.Tensor) -> tuple:
    """What a plan depends on within one process (looked up on every call: kept cheap)."""
    return (tuple(weight.shape), weight.dtype, torch.get_num_threads(),
            os.environ.get("DRAFTERS_LINEAR_FORMS"))  # fmt: skip


def kernel_plan(weight: torch.Tensor) -> tuple[str, ...]:
    """The measured plan for this weight's shape on this machine (in memory, else the file, else
    timed): the form for each row count of PLAN_ROWS."""
    mem = _memory_key(weight)
    plan = _PLANS.get(mem)
    if plan is None:
        forms = forms_for(weight)
        key = _key(weight, forms)
        stored = _read_file().get(key)
        if isinstance(stored, list) and len(stored) == len(PLAN_ROWS) and set(stored) <= set(forms):
            plan = tuple(stored)
        else:
            plan = measure_plan(weight, forms)
            _write_file(key, plan)
        _PLANS[mem] = plan
    return plan
