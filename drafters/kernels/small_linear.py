"""`small_linear(x, w)` = x @ w.T for a few rows of x (float32, CPU): one pass over the weights
for all rows, and batch-invariant (a row gets bit-identical outputs alone or inside a batch).

Why: at decode time every linear of the target sees 1 .. ~16 rows (the AR step, a verify of a
small tree). There the BLAS kernels either run a matrix-vector product per row (a full pass over
the weights each) or repack the weights on every call, so a 4-row verify of SmolLM2's linears
cost 1.3-1.8x a 1-row step where the weight traffic alone says ~1.0x (README, Measured). The
kernel (small_linear.cpp) reads each tile of weight rows once and multiplies it with every row.

Built on first use with torch's C++ extension loader (ninja and a C++ compiler; ~1 min), for the
processor it runs on (`-march=native`: AVX-512 or AVX2 tiles), in `$DRAFTERS_CACHE/kernels/`
under a name keyed by the source, torch version and processor, so a replaced machine builds
its own. `available()` says whether it built here (and why not); nothing falls back silently.
The decoders use it where it measures fastest (`drafters.decoding.linears`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

from drafters.machine import processor_features, processor_name

SOURCE = Path(__file__).with_name("small_linear.cpp")


def _build_dir() -> Path:
    root = Path(os.environ.get("DRAFTERS_CACHE", Path.home() / ".cache" / "drafters"))
    return root.expanduser() / "kernels"


def _name() -> str:
    """One build per source, torch and processor (model and vector extensions)."""
    key = "|".join([SOURCE.read_text(), torch.__version__, processor_name(),
                    ",".join(processor_features())])  # fmt: skip
    return "drafters_small_linear_" + hashlib.sha256(key.encode()).hexdigest()[:12]


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    name = _name()
    folder = _build_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    venv_bin = str(Path(sys.executable).parent)  # ninja installed beside this interpreter
    if venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    return load(name, [str(SOURCE)], extra_cflags=["-O3", "-march=native"],
                build_directory=str(folder), verbose=False)  # fmt: skip


@functools.cache
def available() -> tuple[bool, str]:
    """(built and loaded here, why not)."""
    try:
        _module()
    except Exception as e:  # no compiler, no ninja, a failed build: say which
        return False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e) else ''}"
    return True, ""


def small_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None):
    """x (..., K) @ w (N, K).T (+ bias) -> (..., N), float32 CPU tensors."""
    y = _module().small_linear(x.reshape(-1, x.shape[-1]), w)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], w.shape[0])
