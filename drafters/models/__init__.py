"""Drafter models: pure torch modules built from frozen dataclass configs.

None of them stores the target's embedding or LM head: both are passed in at call time
(a trainable LM-head copy for Medusa/Cerberus is the one opt-in exception).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from drafters.models.cerberus import CerberusConfig, CerberusHeads
from drafters.models.falcon import FalconConfig, FalconDrafter, FalconKVCache, block_causal_mask
from drafters.models.gate import (
    EntropyGate,
    LearnedGate,
    LearnedGateConfig,
    entropy,
    gate_labels,
)
from drafters.models.medusa import MedusaConfig, MedusaHeads

DRAFTERS: dict[str, tuple[type, type[nn.Module]]] = {
    "medusa": (MedusaConfig, MedusaHeads),
    "cerberus": (CerberusConfig, CerberusHeads),
    "falcon": (FalconConfig, FalconDrafter),
}
# Drafters made of per-depth heads: trained with the head loss, decoded on a static tree,
# optionally behind a gate. The other kind, Falcon, drafts k tokens per forward.
HEAD_KINDS = ("medusa", "cerberus")


def aux_layers_of(model: nn.Module) -> tuple[int, ...] | None:
    """The target layers a drafter fuses (a Falcon in EAGLE-3's layout with `aux_layers`: its
    true input features come wide, `drafters.target.with_aux`), else None."""
    return getattr(getattr(model, "cfg", None), "aux_layers", None) or None


def build_drafter(kind: str, cfg_dict: dict) -> nn.Module:
    """The drafter `kind` ("medusa", "cerberus", "falcon") from its config as a plain dict
    (e.g. `dataclasses.asdict(module.cfg)` stored in a checkpoint). Unknown keys are an error."""
    if kind not in DRAFTERS:
        raise ValueError(f"unknown drafter kind {kind!r}; expected one of {sorted(DRAFTERS)}")
    cfg_cls, module_cls = DRAFTERS[kind]
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = set(cfg_dict) - fields
    if unknown:
        raise ValueError(
            f"{kind} config has unknown keys {sorted(unknown)}; valid keys: {sorted(fields)}"
        )
    return module_cls(cfg_cls(**cfg_dict))


__all__ = [
    "CerberusConfig",
    "CerberusHeads",
    "EntropyGate",
    "FalconConfig",
    "FalconDrafter",
    "FalconKVCache",
    "LearnedGate",
    "LearnedGateConfig",
    "MedusaConfig",
    "MedusaHeads",
    "block_causal_mask",
    "build_drafter",
    "entropy",
    "gate_labels",
]
