"""c_tree / c_ar measured on the running machine: the gate's threshold is c_tree / c_ar - 1.

A tree step costs c_tree and yields 1 + a tokens, an AR step costs c_ar and yields 1, so a tree
step pays off iff E[a] > c_tree / c_ar - 1 (docs/design.md section 3). The ratio depends on the
target, the tree, the context length, the device and its load, hence measured, not tuned.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from drafters.decoding.cache import keep_kv, new_cache, target_forward
from drafters.decoding.logits import project
from drafters.decoding.result import sync_clock
from drafters.decoding.tree import Tree, TreeLayout
from drafters.decoding.verify import verify_tree
from drafters.target import Target


@torch.inference_mode()
def measure_cost_ratio(
    target: Target,
    tree: Tree | TreeLayout,
    prompt_len: int,
    reps: int = 5,
    warmup: int = 2,
    draft: Callable[[], object] | None = None,
    seed: int = 0,
) -> float:
    """Median time of a tree step over the median time of a 1-token AR step, on a random
    context of prompt_len tokens. The tree step is `verify_tree` (mask, forward, acceptance,
    cache pruning) plus `draft()` if given (the drafter's share of a tree step); the AR step is
    one 1-token forward with its LM head and argmax."""
    layout = tree.layout if isinstance(tree, Tree) else tree
    gen = torch.Generator().manual_seed(seed)
    vocab = target.vocab_size
    device = target.device
    cache = new_cache(target)
    target_forward(target, cache, torch.randint(vocab, (1, prompt_len), generator=gen).to(device))
    nodes = torch.randint(vocab, (len(layout),), generator=gen).to(device)
    token = nodes[:1].view(1, 1)
    empty = torch.zeros(0, dtype=torch.long)

    def tree_step():
        if draft is not None:
            draft()
        verify_tree(target, cache, nodes, layout)

    def ar_step():
        project(target.lm_head, target_forward(target, cache, token)).argmax(-1).item()

    def timed(step) -> float:
        times = []
        for i in range(warmup + reps):
            t0 = sync_clock(device)
            step()
            t1 = sync_clock(device)
            keep_kv(cache, prompt_len, empty)  # back to the prompt
            if i >= warmup:
                times.append(t1 - t0)
        return statistics.median(times)

    return timed(tree_step) / timed(ar_step)
