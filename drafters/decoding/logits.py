"""Logits of a few positions at a time, the decoders' LM-head product.

On the CPU, MKL runs `x @ W.T` for a handful of rows x against a large W (the LM head: vocabulary x
hidden) as several matrix-vector products, one full pass over W each, so 2-3 rows cost 2-3x one
row; `W @ x.T` takes the one-pass path (`python benchmarks/bench_lm_head.py` prints both). The
decoders project 1 to ~10 positions per call (a step's root, tree nodes or drafter block), so they
go through `project`. Values equal `head(x)` up to float summation order.
"""

from __future__ import annotations

import torch
from torch import nn

ROWS = range(2, 9)  # where the plain product is slower (measured on the CPU); 1 row is fast


def project(head: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """head(x) for x (..., d) -> (..., V), by `W @ x.T` on the CPU for 2 to 8 rows."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or rows not in ROWS:
        return head(x)
    out = torch.mm(head.weight, x.reshape(rows, x.shape[-1]).to(head.weight.dtype).t()).t()
    if head.bias is not None:
        out = out + head.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])
