"""One entry point for speculative decoding with an exported drafter, whatever its kind.

    speculative_decode(target, drafter, input_ids, max_new_tokens, gate=..., tree=...)

Head drafters (Medusa, Cerberus) go to `drafters.decoding.decode_heads` with their static tree
and, optionally, a gate; Falcon goes to `drafters.decoding.falcon.decode_falcon` with its tree
spec. The budget gates, for every kind, go to `drafters.decoding.dynamic.decode_dynamic`: a tree
built each step from the drafter's confidence and sized by the machine's measured step cost
("budget"), with n-gram candidates merged in ("hybrid"). Every path is greedy and lossless:
the output equals the target's plain greedy output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from drafters.decoding import DecodeResult, decode_heads, get_tree, measure_cost_ratio
from drafters.decoding.dynamic import DynamicConfig, decode_dynamic
from drafters.decoding.falcon import decode_falcon
from drafters.decoding.heads import draft_token_ids, head_logits
from drafters.export import LoadedDrafter
from drafters.models import HEAD_KINDS
from drafters.target import Target

# dynamic trees: any drafter kind; "+entropy" / "+learned": a head drafter's gate feeds the budget
BUDGET_GATES = ("budget", "hybrid", "budget+entropy", "budget+learned", "hybrid+entropy",
                "hybrid+learned")  # fmt: skip


def dynamic_config(gate: str, dynamic: DynamicConfig | None) -> DynamicConfig:
    """The dynamic tree's options as a budget gate decodes with them: `dynamic` (None: the
    defaults), without n-gram candidates unless the gate is a hybrid one."""
    cfg = dynamic or DynamicConfig()
    return replace(cfg, ngram=0) if gate.partition("+")[0] == "budget" else cfg


def has_gate(drafter: LoadedDrafter, gate: Any) -> bool:
    if gate in BUDGET_GATES:
        return True
    return drafter.get_gate(gate) is not None if isinstance(gate, str | None) else True


def cost_ratio(target: Target, drafter: LoadedDrafter, prompt_len: int, tree: Any = None) -> float:
    """c_tree / c_ar of a head drafter's tree step on this machine at this context length (the
    drafter's forward and top-k counted in c_tree), as `decode_heads` measures it itself."""
    if drafter.kind not in HEAD_KINDS:
        raise ValueError(f"a {drafter.kind} drafter has no gate, so no cost ratio")
    t = get_tree(tree if tree is not None else drafter.tree)
    f = torch.zeros(1, 1, target.hidden_size, dtype=target.dtype, device=target.device)
    root = torch.zeros((), dtype=torch.long, device=target.device)

    token_ids = draft_token_ids(drafter.model)

    def draft():
        return t.candidates(root, head_logits(drafter.model, f, target.lm_head, t.depth), token_ids)

    return measure_cost_ratio(target, t, prompt_len, draft=draft)


@torch.inference_mode()
def speculative_decode(
    target: Target,
    drafter: LoadedDrafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    gate: Any = "default",
    tree: Any = None,
    cost_ratio: float | None = None,
    stream: Callable[[list[int]], None] | None = None,
    dynamic: DynamicConfig | None = None,
) -> DecodeResult:
    """Greedy speculative decoding of input_ids (1, T) with an exported drafter.

    gate: "default" (the drafter's own, config.json gate.default), "none"/None, "entropy",
    "learned", or any object with `expected_accept(f, logits)` (head drafters); "budget" (a
    dynamic tree sized per step by cost, `tree` unused) or "hybrid" (the same with n-gram
    candidates), any drafter, and for a head drafter "budget+entropy", "hybrid+learned", ...:
    the same with its gate's prediction rescaling the heads' estimates each step;
    `dynamic` sets their options (`DynamicConfig`).
    tree: None (the drafter's exported tree) or a spec for the decoder (a preset name,
    `chain<K>`, a list of paths; Falcon: what `decode_falcon` accepts).
    cost_ratio: c_tree / c_ar for a gated decode (None: measured by the decoder on this prompt).
    stream: called with the new tokens of each step as they are accepted (e.g. a
    `transformers.TextStreamer`'s put, as `drafters-generate --stream` does).
    """
    if gate in BUDGET_GATES:
        source = gate.partition("+")[2]
        if source and drafter.kind not in HEAD_KINDS:
            raise ValueError(f"a {drafter.kind} drafter has no gate (asked for {gate!r})")
        g = drafter.get_gate(source) if source else None
        cfg = dynamic_config(gate, dynamic)
        return decode_dynamic(target, drafter.model, input_ids, max_new_tokens, cfg,
                              stream=stream, gate=g)  # fmt: skip
    if drafter.kind in HEAD_KINDS:
        g = drafter.get_gate(gate) if isinstance(gate, str | None) else gate
        return decode_heads(
            target,
            drafter.model,
            drafter.tree if tree is None else tree,
            input_ids,
            max_new_tokens,
            gate=g,
            cost_ratio=cost_ratio if g is not None else None,
            stream=stream,
        )
    if gate not in (None, "none", "default"):
        raise ValueError(f"a {drafter.kind} drafter has no gate (asked for {gate!r})")
    tree = drafter.tree if tree is None else tree
    kwargs = {} if tree is None else {"tree": tree}
    return decode_falcon(target, drafter.model, input_ids, max_new_tokens, stream=stream, **kwargs)
