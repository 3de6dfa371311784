"""Greedy, batch-1 decoders over a frozen target: plain AR, static-tree heads (Medusa/Cerberus).

No Lightning or Hydra here: the decoders take a `Target`, a drafter module and a tree.
"""

from drafters.decoding.ar import decode_ar
from drafters.decoding.cost import measure_cost_ratio
from drafters.decoding.heads import Gate, HeadDrafter, decode_heads, gate_threshold
from drafters.decoding.result import DecodeResult
from drafters.decoding.tree import PRESETS, Tree, TreeLayout, build_tree, chain, get_tree
from drafters.decoding.verify import Verification, tree_attention_mask, verify_tree

__all__ = [
    "PRESETS",
    "DecodeResult",
    "Gate",
    "HeadDrafter",
    "Tree",
    "TreeLayout",
    "Verification",
    "build_tree",
    "chain",
    "decode_ar",
    "decode_heads",
    "gate_threshold",
    "get_tree",
    "measure_cost_ratio",
    "tree_attention_mask",
    "verify_tree",
]
