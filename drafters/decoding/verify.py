"""Greedy tree verification: one target forward over root + draft nodes, then accept.

Works for any tree given as node tokens + a `TreeLayout` (parents in topological order), so a
static Medusa tree and a tree built afresh each step (Falcon) share it. The forward is the stock
HF decoder on the `DynamicCache` (docs/design.md section 9): node i has position id past_len +
depth[i] and attends to the whole prefix, itself and its ancestors (a 4D additive float mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from drafters.decoding.cache import keep_kv, target_forward
from drafters.decoding.linears import project
from drafters.decoding.tree import TreeLayout
from drafters.target import Target


@dataclass
class Verification:
    path: torch.Tensor  # (a + 1,) accepted node indices, root (0) first; long, on the CPU
    accepted: list[int]  # the a accepted draft tokens (the tokens of path[1:])
    bonus: int  # the target's argmax after the last accepted node: the next root
    features: torch.Tensor  # (1, a + 1, d) f at root + accepted nodes (post final norm; wide
    # with aux_layers)
    logits: torch.Tensor  # (1, 1, V) target logits at the last accepted node (argmax = bonus)


def tree_attention_mask(
    layout: TreeLayout, past_len: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """(1, 1, n, past_len + n) additive mask: 0.0 where a node may attend, finfo.min elsewhere."""
    n = len(layout)
    mask = torch.zeros(n, past_len + n, dtype=dtype, device=device)
    blocked = ~layout.ancestors.to(device)  # (n, n)
    mask[:, past_len:].masked_fill_(blocked, torch.finfo(dtype).min)
    return mask[None, None]


def verify_tree(
    target: Target,
    cache: DynamicCache,
    tokens: torch.Tensor,
    layout: TreeLayout,
    aux_layers: tuple[int, ...] | None = None,
) -> Verification:
    """Verify node tokens (n,) (tokens[0] = root, the pending token not yet in the cache).
    aux_layers: the features come wide (`drafters.target.with_aux`), for an EAGLE-3 drafter.

    Greedy acceptance: the deepest node whose path tokens all equal the target's argmax at their
    parents (first such node on ties). The cache keeps the prefix + root + accepted nodes only.
    """
    past_len = cache.get_seq_length()
    device = target.device
    layout = layout.to(device)
    mask = tree_attention_mask(layout, past_len, target.dtype, device)
    positions = (past_len + layout.depth)[None]  # (1, n)
    f = target_forward(target, cache, tokens.view(1, -1).to(device), positions, mask, aux_layers)
    logits = project(target.lm_head, f[..., : target.hidden_size])  # (1, n, V)

    greedy = logits[0].argmax(-1)  # (n,) the target's next token after each node
    match = tokens.to(device) == greedy[layout.parents.clamp(min=0)]  # node == argmax at parent
    match[0] = True  # the root is already committed
    ok = ~(layout.ancestors & ~match[None]).any(-1)  # (n,) node and all its ancestors match
    best = int((layout.depth * ok).argmax())  # deepest accepted node
    path = layout.ancestors[best].nonzero().squeeze(-1).cpu()  # (a + 1,) root .. best

    keep_kv(cache, past_len, path)
    path_dev = path.to(device)
    return Verification(
        path=path,
        accepted=tokens[path[1:]].tolist(),
        bonus=int(greedy[best]),
        features=f[:, path_dev],
        logits=logits[:, best : best + 1],
    )
