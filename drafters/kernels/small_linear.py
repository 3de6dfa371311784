"""`small_linear(x, w)` = x @ w.T for a few rows of x (float32 or bfloat16, CPU): one pass over
the weights for all rows, and batch-invariant (a row gets bit-identical outputs alone or inside a
batch). bfloat16 sums in float32 and rounds once, at the end.

Why: at decode time every linear of the target sees 1 .. ~16 rows (the AR step, a verify of a
small tree). There the BLAS kernels either run a matrix-vector product per row (a full pass over
the weights each) or repack the weights on every call, so a 4-row verify of SmolLM2's linears
cost 1.3-1.8x a 1-row step where the weight traffic alone says ~1.0x (README, Measured). The
kernel (small_linear.cpp) reads the weights in a packed layout (panels of VEC output rows,
K-major), made once per weight and kept beside it (`packed`: a second copy of each weight the
kernel runs, dropped with the weight and made again after an in-place change), and multiplies
each panel with every row of x from registers.

Built on first use with torch's C++ extension loader (ninja and a C++ compiler; ~1 min), for the
processor it runs on (`-march=native`: AVX-512 or AVX2 tiles; bfloat16 pairs multiplied by
AVX512-BF16's dot product where the processor has it, else widened to float32), in
`$DRAFTERS_CACHE/kernels/` under a name keyed by the source, torch version and processor, so a
replaced machine builds its own. `available()` says whether it built here (and why not); nothing
falls back silently.
The decoders use it where it measures fastest (`drafters.decoding.linears`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from drafters.machine import processor_features, processor_name

SOURCE = Path(__file__).with_name("small_linear.cpp")
# fused multiply-adds everywhere, so every tile runs the same operations (batch invariance)
# -fopenmp: at::parallel_for splits the panels over torch's threads only when compiled with
# OpenMP (without it the kernel ran on one thread whatever torch.set_num_threads said); linked
# with -fopenmp the build needs libgomp.so.1, which resolves to the one torch already loaded, so
# torch.set_num_threads governs it
CFLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()  # weight -> (its state, packed copy)


def _build_dir() -> Path:
    root = Path(os.environ.get("DRAFTERS_CACHE", Path.home() / ".cache" / "drafters"))
    return root.expanduser() / "kernels"


@functools.cache
def _name(flags: tuple[str, ...] = tuple(CFLAGS)) -> str:
    """One build per source, flags, torch and processor (model and vector extensions)."""
    key = "|".join([SOURCE.read_text(), " ".join(flags), torch.__version__, processor_name(),
                    ",".join(processor_features())])  # fmt: skip
    return "drafters_small_linear_" + hashlib.sha256(key.encode()).hexdigest()[:12]


@functools.cache
def _module(flags: tuple[str, ...] = tuple(CFLAGS)):
    """The kernel built with these compiler flags (the tests build a variant too)."""
    from torch.utils.cpp_extension import load

    name = _name(flags)
    folder = _build_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    venv_bin = str(Path(sys.executable).parent)  # ninja installed beside this interpreter
    if venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    return load(name, [str(SOURCE)], extra_cflags=list(flags), extra_ldflags=LDFLAGS,
                build_directory=str(folder), verbose=False)  # fmt: skip


@functools.cache
def available() -> tuple[bool, str]:
    """(built and loaded here, why not)."""
    try:
        _module()
    except Exception as e:  # no compiler, no ninja, a failed build: say which
        return False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e) else ''}"
    return True, ""


def build_name() -> str:
    """The kernel build this process uses (source, torch and processor): measured plans that
    rank it are keyed by it, so an edited kernel is measured anew."""
    return _name()


def packed(w: torch.Tensor) -> torch.Tensor:
    """w (N, K) in the kernel's layout, zero rows past N: float32 (ceil(N / VEC), K, VEC);
    bfloat16 (ceil(N / VEC), ceil(K / 2), VEC, 2), a zero column added to an odd K. Made on the
    first call for a weight, kept while the weight lives, made again if the weight was changed in
    place (its version counter) or re-pointed."""
    try:
        version = w._version
    except RuntimeError:  # an inference tensor keeps no version counter (nor changes outside it)
        version = -1
    state = (w.data_ptr(), version, tuple(w.shape))
    hit = _PACKED.get(w)
    if hit is not None and hit[0] == state:
        return hit[1]
    vec = _module().vec_width()
    N, K = w.shape
    P = -(-N // vec)
    with torch.no_grad():
        if w.dtype == torch.bfloat16:
            K2 = -(-K // 2)
            wp = F.pad(w.detach(), (0, 2 * K2 - K, 0, P * vec - N)).view(P, vec, K2, 2)
            wp = wp.transpose(1, 2).contiguous()
        else:
            wp = F.pad(w.detach(), (0, 0, 0, P * vec - N)).view(P, vec, K).transpose(1, 2)
            wp = wp.contiguous()
    _PACKED[w] = (state, wp)
    return wp


def bf16_products() -> str:
    """How this build multiplies bfloat16: "avx512bf16" (the processor's dot product of pairs)
    or "widened" (each half widened to float32, two FMAs)."""
    return _module().bf16_products()


def packed_product(rows: torch.Tensor, wp: torch.Tensor, n: int) -> torch.Tensor:
    """rows (M, K) @ w.T -> (M, n) from wp = packed(w), unchecked: for callers that hold the
    packed weight (the decoders' fitted linears, where a per-call check cost ~10 us a linear)."""
    if rows.dtype == torch.bfloat16 and rows.shape[1] % 2:  # pairs of k: w has a zero column
        rows = F.pad(rows, (0, 1))
    return _module().small_linear(rows, wp, n)


def small_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None):
    """x (..., K) @ w (N, K).T (+ bias) -> (..., N), float32 or bfloat16 CPU tensors (x and w
    alike)."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise RuntimeError(f"small_linear: x (M, K) and w (N, K), got {tuple(x.shape)} and "
                           f"{tuple(w.shape)}")  # fmt: skip
    if x.dtype != w.dtype or x.dtype not in (torch.float32, torch.bfloat16):
        raise RuntimeError(f"small_linear: float32 or bfloat16 only, x and w alike, got {x.dtype} "
                           f"and {w.dtype}")  # fmt: skip
    y = packed_product(x.reshape(-1, x.shape[-1]), packed(w), w.shape[0])
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], w.shape[0])
