"""Falcon's later drafter passes as decoded, for training and measurement (docs/design.md
section 4): the drafter's own pairs in the blocks being predicted, true pairs everywhere before.

At decoding time with N = alpha * k committed positions (blocks aligned at N, see
decoding/falcon.py), pass 1 reads true pairs; its last block (alpha - 1) gives depths 1..k. Pass c
(c >= 2) runs one block per anchor at block alpha + c - 2: it reads the drafter's own (feature,
token) pairs, sees its ancestor blocks alpha .. alpha + c - 3 (own pairs too) and the *true* keys
of every committed position < N. Training reproduces this for every block of a sequence in one
forward per pass. Copy c of the sequence (its T positions, the same position ids) goes on the
drafter's KV cache after copies 1 (teacher-forced) .. c - 1; its position m in block beta, whose
chain starts at block alpha = beta - (c - 2), sees (`own_block_bias`):

    copy 1 (true pairs)        blocks < alpha
    copy c' (2 <= c' <= c)     block alpha + c' - 2 only, both ways inside the block

padding hidden, itself always. k = 2, copy 2 (T = true key, o = own key, . = hidden):

    q\\kv      copy 1: 0 1 2 3 4 5    copy 2: 0 1 2 3 4 5
    copy 2  2          T T . . . .            . . o o . .
            3          T T . . . .            . . o o . .
            4          T T T T . .            . . . . o o

Its input at m is own(m) = copy c-1's output at m - k with its argmax token (CSGD's coupling),
where m is a candidate (that output was trained: `csgd.py`), else the true pair.

Depth d below the root t_N (N a multiple of k) is predicted at position N - k + d - 1 of copy
ceil(d / k) (`depth_view`). `depth_counts` turns per-position ranks into P(the rank-r token at
depth d is right | the top-1 drafts at depths < d are right), the rates a chain's acceptance and
the tree builder multiply (`val/acc_depth{d}`, `drafters-tune`).
"""

from __future__ import annotations

import torch


def own_block_bias(
    position_ids: torch.Tensor, attention_mask: torch.Tensor | None, k: int, copy: int
) -> torch.Tensor:
    """(B, 1, T, copy * T) bool attn_bias (True = attend) of copy `copy` >= 2 over the keys of
    copies 1 .. copy (in cache order), position_ids (B, T)."""
    B, T = position_ids.shape
    blk = position_ids // k
    real = (
        torch.ones(B, T, dtype=torch.bool, device=blk.device)
        if attention_mask is None
        else attention_mask.bool()
    ).unsqueeze(1)  # (B, 1, Tk)
    root = blk.unsqueeze(2) - (copy - 2)  # (B, Tq, 1): the chain's first own block
    key = blk.unsqueeze(1)  # (B, 1, Tk)
    parts = [(key < root) & real]
    parts += [(key == root + c - 2) & real for c in range(2, copy + 1)]
    parts[-1] = parts[-1] | torch.eye(T, dtype=torch.bool, device=blk.device)
    return torch.cat(parts, dim=-1).unsqueeze(1)


def _shift(x: torch.Tensor, s: int, fill) -> torch.Tensor:
    """y[:, i] = x[:, i - s] along dim 1 (s may be negative), `fill` outside."""
    T = x.shape[1]
    y = torch.full_like(x, fill)
    if abs(s) >= T:
        return y
    if s >= 0:
        y[:, s:] = x[:, : T - s]
    else:
        y[:, : T + s] = x[:, -s:]
    return y


def depth_view(per_copy: list[torch.Tensor], k: int, fill) -> torch.Tensor:
    """(B, T, D), D = k * len(per_copy): out[b, i, d - 1] = per_copy[c][b, i - k + d - 1] with
    c = (d - 1) // k, the copy position that predicts depth d below a root at index i."""
    D = k * len(per_copy)
    cols = [_shift(per_copy[(d - 1) // k], k - d + 1, fill) for d in range(1, D + 1)]
    return torch.stack(cols, dim=-1)


def depth_counts(
    ranks: list[torch.Tensor],
    defined: list[torch.Tensor],
    position_ids: torch.Tensor,
    k: int,
    topk: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts (D, topk), totals (D,)): over roots t_N with N a multiple of k whose depths
    1 .. d are all `defined` (labels generated, the copies' inputs own pairs) and whose top-1
    drafts at depths < d are right, totals[d-1] counts them and counts[d-1, r] those whose
    depth-d label has rank r. ranks, defined: per copy (B, T) (rank of the label at each
    position, 0 = the argmax; read where defined only)."""
    r = depth_view(ranks, k, topk)  # (B, T, D)
    ok = depth_view(defined, k, False) & (position_ids % k == 0).unsqueeze(-1)
    ok = ok.long().cumprod(-1).bool()  # depths 1 .. d all defined
    right = (r == 0).long().cumprod(-1).bool()
    before = torch.cat([torch.ones_like(right[..., :1]), right[..., :-1]], dim=-1)
    rows = ok & before  # (B, T, D): the chain reached depth d
    totals = rows.sum((0, 1))
    D = r.shape[-1]
    counts = torch.zeros(D, topk, dtype=torch.long, device=r.device)
    for rank in range(topk):
        counts[:, rank] = (rows & (r == rank)).sum((0, 1))
    return counts, totals


def depth_accuracy(counts: torch.Tensor, totals: torch.Tensor) -> dict[str, torch.Tensor]:
    """`acc_depth{d}`: P(depth d's top-1 draft right | depths < d right), 0 where never reached."""
    acc = counts[:, 0].float() / totals.clamp(min=1).float()
    return {f"acc_depth{d + 1}": a for d, a in enumerate(acc)}
