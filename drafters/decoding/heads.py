"""Static-tree decoding with head drafters (Medusa, Cerberus), optionally gated per step.

One step, from the last committed position j (its feature f_j and target logits p_j; the root
token t_{j+1} = argmax p_j is emitted but not yet in the cache):
  gate: speculate iff E[a] > c_tree / c_ar - 1 (docs/design.md section 3), else one AR step.
  tree step: heads(f_j) -> per-head top-k (logits of the tree's depth first heads only, by
    `head_logits`); node tokens from the tree's ranks; one verification
    forward; emit the accepted draft tokens and the bonus token; the last accepted position
    gives the next f and logits.
  AR step: feed the root alone; no heads, no tree, no mask; its logits feed the next decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from drafters.decoding.cache import new_cache, target_forward
from drafters.decoding.cost import measure_cost_ratio
from drafters.decoding.linears import fitted, project
from drafters.decoding.result import DecodeResult, Generation
from drafters.decoding.tree import Tree, get_tree
from drafters.decoding.verify import verify_tree
from drafters.target import Target


class HeadDrafter(Protocol):
    """A head drafter (`drafters.models.heads.HeadDrafter`); its `vocab` attribute, when it has
    one and it is not None, maps logit columns to target ids (a draft vocabulary)."""

    def __call__(self, features: torch.Tensor, lm_head: nn.Linear) -> torch.Tensor:
        """features (B, T, d) -> logits (B, T, K, V or V_d); head i predicts the token at offset
        2 + i from the feature's position (the target's LM head predicts offset 1)."""
        ...


def draft_token_ids(drafter) -> torch.Tensor | None:
    """The target id of each of the drafter's logit columns, or None (column j is token j)."""
    vocab = getattr(drafter, "vocab", None)
    return None if vocab is None else vocab.ids


def head_logits(drafter, f: torch.Tensor, lm_head: nn.Linear, depth: int) -> torch.Tensor:
    """(depth, V or V_d): the logits of the first `depth` heads at f (1, 1, d), the only ones a
    tree of that depth reads, through `project` (the measured LM-head kernel) when the drafter
    exposes its pre-head states (`hidden`, `scoring_head`); else its full forward, cut."""
    if not hasattr(drafter, "hidden"):
        return drafter(f, lm_head)[0, 0, :depth]
    return project(drafter.scoring_head(lm_head), drafter.hidden(f)[0, 0, :depth])


class Gate(Protocol):
    def expected_accept(self, features: torch.Tensor, target_logits: torch.Tensor):
        """features (1, 1, d), target_logits (1, 1, V) -> E[a], expected accepted draft tokens
        (a float or a 1-element tensor)."""
        ...


def gate_threshold(cost_ratio: float) -> float:
    """Speculate iff E[a] > this: a tree step costs c_tree for 1 + a tokens, AR c_ar for 1."""
    return cost_ratio - 1.0


@torch.inference_mode()
@fitted
def decode_heads(
    target: Target,
    drafter: HeadDrafter,
    tree: Tree | str | Sequence[Sequence[int]],
    input_ids: torch.Tensor,
    max_new_tokens: int,
    gate: Gate | None = None,
    cost_ratio: float | None = None,
    threshold_override: float | None = None,
    stream: Callable[[list[int]], None] | None = None,
) -> DecodeResult:
    """Greedy static-tree decoding of input_ids (1, T); output identical to plain greedy.

    Without a gate every step is a tree step. With one, the threshold is
    `gate_threshold(cost_ratio)`, cost_ratio measured here by `measure_cost_ratio` when not
    given (pass it to time several prompts fairly). threshold_override replaces the threshold:
    -inf forces tree steps, +inf AR steps (gate optional for both). stream: called with the
    tokens of each step as they are accepted.
    """
    tree = get_tree(tree)
    input_ids = input_ids.to(target.device)
    layout = tree.layout.to(target.device)
    if threshold_override is not None:
        threshold = threshold_override
    elif gate is None:
        threshold = -math.inf  # no gate: always speculate
    else:
        if cost_ratio is None:
            cost_ratio = _measure(target, drafter, tree, input_ids)
        threshold = gate_threshold(cost_ratio)
    if gate is None and math.isfinite(threshold):
        raise ValueError("a finite threshold needs a gate; use -inf / +inf to force tree / AR")

    def speculate(f: torch.Tensor, logits: torch.Tensor) -> bool:
        if math.isinf(threshold):
            return threshold < 0
        return float(gate.expected_accept(f, logits)) > threshold

    token_ids = draft_token_ids(drafter)
    gen = Generation(input_ids, max_new_tokens, target.eos_token_ids, stream)
    if gen.done:
        return gen.result()
    cache = new_cache(target)
    f = target_forward(target, cache, input_ids)[:, -1:]  # (1, 1, d) last prompt position
    logits = project(target.lm_head, f)  # (1, 1, V)
    root = logits.argmax(-1)  # (1, 1) emitted, not yet in the cache
    gen.emit([root.item()])
    while not gen.done:
        if speculate(f, logits):
            heads = head_logits(drafter, f, target.lm_head, tree.depth)  # (depth, V or V_d)
            tokens = tree.candidates(root, heads, token_ids)  # (n,) root + draft nodes
            v = verify_tree(target, cache, tokens, layout)
            gen.step(v.accepted + [v.bonus], drafted=len(v.accepted), tree=True, nodes=len(tree))
            f, logits = v.features[:, -1:], v.logits  # (1, 1, d), (1, 1, V)
            root = torch.tensor([[v.bonus]], device=target.device)
        else:
            f = target_forward(target, cache, root)  # (1, 1, d)
            logits = project(target.lm_head, f)  # (1, 1, V)
            root = logits.argmax(-1)  # (1, 1)
            gen.step([root.item()], drafted=0, tree=False)
    return gen.result()


def _measure(target: Target, drafter: HeadDrafter, tree: Tree, input_ids: torch.Tensor) -> float:
    """c_tree / c_ar on this machine, the drafter's forward and top-k counted in c_tree."""
    f = torch.zeros(1, 1, target.hidden_size, dtype=target.dtype, device=target.device)

    token_ids = draft_token_ids(drafter)

    def draft():
        heads = head_logits(drafter, f, target.lm_head, tree.depth)
        return tree.candidates(input_ids[0, -1], heads, token_ids)

    return measure_cost_ratio(target, tree, input_ids.shape[1], draft=draft)
