"""The target's forward on an HF `DynamicCache`, and in-place pruning of that cache.

Cache invariant of every decoder here: the cache holds the KV entries of every committed token
except the last one. That last token (the "root": the bonus token of the previous forward, or the
prefill's first token) has been emitted but not yet fed to the target; the next forward, a
1-token AR step or a tree verification, starts with it.
"""

from __future__ import annotations

import inspect
from functools import cache as memoize

import torch
from transformers import DynamicCache

from drafters.target import Target


def new_cache(target: Target) -> DynamicCache:
    return DynamicCache(config=target.config)


@memoize
def _cache_kwarg(model_cls: type) -> str:
    # transformers >= 5.x renamed `past_key_values` to `cache` (the old name is deprecated).
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def target_forward(
    target: Target,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the target's decoder over input_ids (1, T) on top of the cache (which grows by T).

    position_ids / attention_mask default to a causal continuation of the cache; a tree passes
    its own (1, T) positions and a 4D float mask. Returns f: (1, T, d), after the final norm.
    """
    backbone = target.model.model
    out = backbone(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        use_cache=True,
        **{_cache_kwarg(type(backbone)): cache},
    )
    return out.last_hidden_state


def keep_kv(cache: DynamicCache, start: int, keep: torch.Tensor) -> None:
    """Keep cache entries [0, start) and start + keep, drop the rest; in place, per layer.

    keep: (m,) ascending offsets with keep[j] >= j (a root-to-node path in topological order),
    so the kept entries move left: only those m entries are copied, the prefix is not touched,
    and the tail is dropped with a view.
    """
    m = keep.numel()
    moved = not torch.equal(keep.cpu(), torch.arange(m))
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) or hasattr(layer, "cumulative_length"):
            raise NotImplementedError(f"cannot prune a {type(layer).__name__} cache layer")
        if moved:
            idx = start + keep.to(layer.keys.device)
            layer.keys[..., start : start + m, :] = layer.keys[..., idx, :]
            layer.values[..., start : start + m, :] = layer.values[..., idx, :]
        layer.keys = layer.keys[..., : start + m, :]
        layer.values = layer.values[..., : start + m, :]
