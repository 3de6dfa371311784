"""Costs measured on the running machine: the gate's c_tree / c_ar, and the target forward's
cost by the number of rows it verifies.

A tree step costs c_tree and yields 1 + a tokens, an AR step costs c_ar and yields 1, so a tree
step pays off iff E[a] > c_tree / c_ar - 1 (docs/design.md section 3). The ratio depends on the
target, the tree, the context length, the device and its load, hence measured, not tuned.

A forward over n new tokens costs t(n), and t rises in steps where the kernels change shape
(measured on one core: t(4)/t(3) = 1.25 while 9 rows cost as much as 16), so a tree of n - 1
nodes is best sized just below a step (`forward_cost_profile`, `snap_sizes`; drafters-tune
snaps its candidate sizes so).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from drafters.decoding.cache import keep_kv, new_cache, target_forward
from drafters.decoding.linears import fitted, project
from drafters.decoding.result import sync_clock
from drafters.decoding.tree import Tree, TreeLayout
from drafters.decoding.verify import verify_tree
from drafters.target import Target


@torch.inference_mode()
@fitted
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


def forward_cost_profile(
    target: Target, max_rows: int = 33, prompt_len: int = 128, reps: int = 3, seed: int = 0
) -> list[float]:
    """t(n) / t(1) for n = 1 .. max_rows (`forward_seconds`). Index n - 1 holds t(n) / t(1)."""
    times = forward_seconds(target, max_rows, prompt_len, reps, seed)
    return [t / times[0] for t in times]


@torch.inference_mode()
@fitted
def forward_seconds(
    target: Target, max_rows: int = 33, prompt_len: int = 128, reps: int = 3, seed: int = 0
) -> list[float]:
    """t(n) for n = 1 .. max_rows: the median seconds of a target forward over n new tokens (a
    tree of n - 1 nodes and its root, with a tree mask) plus its LM head, on a random context of
    prompt_len tokens."""
    from drafters.decoding.verify import tree_attention_mask

    gen = torch.Generator().manual_seed(seed)
    device = target.device
    cache = new_cache(target)
    ctx = torch.randint(target.vocab_size, (1, prompt_len), generator=gen).to(device)
    target_forward(target, cache, ctx)
    empty = torch.zeros(0, dtype=torch.long)
    times = []
    for n in range(1, max_rows + 1):
        layout = TreeLayout.from_parents([-1] + list(range(n - 1)))  # a chain: any tree costs alike
        tokens = torch.randint(target.vocab_size, (1, n), generator=gen).to(device)
        positions = (prompt_len + layout.depth.to(device))[None]
        mask = tree_attention_mask(layout, prompt_len, target.dtype, device)
        samples = []
        for i in range(reps + 1):
            t0 = sync_clock(device)
            project(target.lm_head, target_forward(target, cache, tokens, positions, mask))
            t1 = sync_clock(device)
            keep_kv(cache, prompt_len, empty)
            if i:  # the first call warms up
                samples.append(t1 - t0)
        times.append(statistics.median(samples))
    return times


_PROFILES: dict[tuple, list[float]] = {}


def cost_profile(target: Target, max_rows: int) -> list[float]:
    """`forward_cost_profile(target, max_rows)`, measured once per target, row count and thread
    count in this process (a few seconds for SmolLM2 on one core)."""
    key = (id(target), max_rows, torch.get_num_threads(), str(target.dtype))
    if key not in _PROFILES:
        _PROFILES[key] = forward_cost_profile(target, max_rows)
    return _PROFILES[key]


def snap_sizes(profile: list[float], sizes: list[int], step: float = 0.1) -> list[int]:
    """Tree sizes (nodes) moved to just below a cost step of `profile` (t(n) / t(1) by rows n):
    a size of s nodes (s + 1 rows) grows to the last row count before the next step (a rise of
    more than `step` over the cost of s + 1 rows), nodes there being free. Sorted, distinct,
    capped by the profile's length."""
    rows = len(profile)
    out = set()
    for s in sizes:
        r = min(s + 1, rows)
        e = r
        while e < rows and profile[e] <= profile[r - 1] * (1 + step):  # t(e + 1) still free
            e += 1
        out.add(e - 1)
    return sorted(n for n in out if n >= 1)
