"""Label alignment and validity shared by every drafter loss.

`loss_mask[b, j] = 1` iff token j is a token the target generated (an assistant token, as the
chat template renders it); 0 for system/user/template tokens and padding.

A label is trained iff the drafter would be asked for it at decoding time: the label token is
generated, and the drafter's input ends inside the same response. Concretely, a position j with
a label at offset `last` is valid iff tokens j+first .. j+last are all masked-in, where token
j+first is the first token the drafter's context must already contain as generated text:

- Medusa/Cerberus head i at position t (label t_{t+2+i}): first = 1, last = 2+i. So t = the
  last prompt token (whose f_t starts the first step) is trained; t inside a user turn is not.
- Falcon position j (labels f_{j+k}, t_{j+k+1}): first = k, last = k+1, since the block ending
  at the last known token t_{e+1} covers positions e-k+1..e.

Requiring the whole span to be masked-in keeps a label from crossing a turn boundary.
"""

from __future__ import annotations

import torch


def shift_left(x: torch.Tensor, n: int, fill: float | int = 0) -> torch.Tensor:
    """y[:, j] = x[:, j+n] along dim 1; the last n positions get `fill`. (B, T, ...) -> same."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)[:, : x.shape[1]]


def span_valid(loss_mask: torch.Tensor, first: int, last: int) -> torch.Tensor:
    """(B, T) bool: valid[b, j] iff j + last < T and loss_mask[b, j+first .. j+last] are all 1."""
    m = loss_mask.bool().long()
    B, T = m.shape
    c = torch.nn.functional.pad(m.cumsum(-1), (1, 0))  # c[:, n] = sum(m[:, :n]), (B, T+1)
    j = torch.arange(T, device=m.device)
    hi = (j + last + 1).clamp(max=T).expand(B, T)
    lo = (j + first).clamp(max=T).expand(B, T)
    full = c.gather(1, hi) - c.gather(1, lo) == last - first + 1
    return full & (j + last < T)


def default_position_ids(attention_mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Real tokens before each position (as `Target.features` and `FalconDrafter`): (B, T)."""
    if attention_mask is None:
        B, T = like.shape[:2]
        return torch.arange(T, device=like.device).expand(B, T)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pooled_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask`, 0 if empty: (B, T) -> scalar."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean of `values` where `mask`, 0 if empty: (B, T) -> (B,)."""
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp(min=1)
