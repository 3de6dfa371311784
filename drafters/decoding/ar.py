"""Plain greedy auto-regressive decoding with a KV cache: the in-house baseline (tau = 1)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from drafters.decoding.cache import new_cache, target_forward
from drafters.decoding.linears import fitted, project
from drafters.decoding.result import DecodeResult, Generation
from drafters.target import Target


@torch.inference_mode()
@fitted
def decode_ar(
    target: Target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    stream: Callable[[list[int]], None] | None = None,
) -> DecodeResult:
    """Greedy decoding of input_ids (1, T): prefill, then one target forward per token.

    Same output as `target.model.generate(input_ids, do_sample=False, max_new_tokens=...)`.
    stream: called with each new token as it is emitted.
    """
    input_ids = input_ids.to(target.device)
    gen = Generation(input_ids, max_new_tokens, target.eos_token_ids, stream)
    if gen.done:
        return gen.result()
    cache = new_cache(target)
    f = target_forward(target, cache, input_ids)[:, -1:]  # (1, 1, d): the last prompt position
    token = project(target.lm_head, f).argmax(-1)  # (1, 1)
    gen.emit([token.item()])  # the prefill's token
    while not gen.done:
        f = target_forward(target, cache, token)  # (1, 1, d)
        token = project(target.lm_head, f).argmax(-1)  # (1, 1)
        gen.step([token.item()], drafted=0, tree=False)
    return gen.result()
