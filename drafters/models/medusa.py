"""Medusa heads (docs/design.md section 2): K independent stacks of zero-initialised ResBlocks.

Head i (0-based) reads the target's post-norm feature f_t and predicts token t+2+i; the target's
own LM head already predicts t+1. Each head is L ResBlocks `x + SiLU(W x + b)` followed by an LM
head: the target's frozen one (passed in at call time, never stored) or a trainable copy owned
by the module (`trainable_lm_head=True`, initialised with `load_lm_head`).

Unlike Medusa's and Hydra's released code (`[ResBlock(d)] * L`, one module repeated), every
stacked block here is its own module with its own storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from drafters.models.heads import HeadDrafter


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int  # d, the target's hidden size
    vocab_size: int  # V, the target's vocabulary
    num_heads: int = 4  # K: head i predicts token t+2+i
    num_layers: int = 1  # L ResBlocks per head
    trainable_lm_head: bool = False  # own a trainable copy of the LM head instead of sharing
    draft_vocab_size: int | None = None  # V_d: score only these target ids (models/vocab.py)

    def num_params(self) -> int:
        """K * L * (d^2 + d)  [+ V * d with a trainable LM head (no bias); V_d * d with a draft
        vocabulary]."""
        d = self.hidden_size
        n = self.num_heads * self.num_layers * (d * d + d)
        rows = self.draft_vocab_size or self.vocab_size
        return n + (rows * d if self.trainable_lm_head else 0)


def num_params(cfg: MedusaConfig) -> int:
    """K * L * (d^2 + d)  [+ V * d with a trainable LM head]. See `MedusaConfig.num_params`."""
    return cfg.num_params()


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W and b zero-initialised: the identity at init (SiLU(0) = 0).

    Medusa zero-initialises W only; its default-initialised bias makes a new block add SiLU(b),
    not the identity. Zeroing b as well costs nothing: dL/dW = 0.5 * g x^T is non-zero at init.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(HeadDrafter):
    def __init__(self, cfg: MedusaConfig):
        super().__init__(cfg)
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(cfg.hidden_size) for _ in range(cfg.num_layers)])
            for _ in range(cfg.num_heads)
        )

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, T, d) -> pre-LM-head states (B, T, K, d); slot i is head i."""
        return torch.stack([head(features) for head in self.heads], dim=2)
