"""Greedy, batch-1 decoders over a frozen target: plain AR, static-tree heads (Medusa/Cerberus),
Falcon's custom-designed tree.

No Lightning or Hydra here: the decoders take a `Target`, a drafter module and a tree.
"""

from drafters.decoding.ar import decode_ar
from drafters.decoding.cost import measure_cost_ratio
from drafters.decoding.falcon import DrafterContext, decode_falcon, draft_tree
from drafters.decoding.falcon_tree import (
    FALCON_PRESETS,
    FalconPlan,
    build_falcon_tree,
    get_falcon_tree,
)
from drafters.decoding.heads import Gate, HeadDrafter, decode_heads, gate_threshold
from drafters.decoding.result import DecodeResult
from drafters.decoding.tree import PRESETS, Tree, TreeLayout, build_tree, chain, get_tree
from drafters.decoding.verify import Verification, tree_attention_mask, verify_tree

__all__ = [
    "FALCON_PRESETS",
    "PRESETS",
    "DecodeResult",
    "DrafterContext",
    "FalconPlan",
    "Gate",
    "HeadDrafter",
    "Tree",
    "TreeLayout",
    "Verification",
    "build_falcon_tree",
    "build_tree",
    "chain",
    "decode_ar",
    "decode_falcon",
    "decode_heads",
    "draft_tree",
    "gate_threshold",
    "get_falcon_tree",
    "get_tree",
    "measure_cost_ratio",
    "tree_attention_mask",
    "verify_tree",
]
