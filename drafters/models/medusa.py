"""Medusa heads (methods.md section 2): K independent stacks of zero-initialised ResBlocks.

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


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int  # d, the target's hidden size
    vocab_size: int  # V, the target's vocabulary (only used by a trainable LM head)
    num_heads: int = 4  # K: head i predicts token t+2+i
    num_layers: int = 1  # L ResBlocks per head
    trainable_lm_head: bool = False  # own a trainable copy of the LM head instead of sharing

    def num_params(self) -> int:
        """K * L * (d^2 + d)  [+ V * d with a trainable LM head (no bias)]."""
        d = self.hidden_size
        n = self.num_heads * self.num_layers * (d * d + d)
        return n + (self.vocab_size * d if self.trainable_lm_head else 0)


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


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(cfg.hidden_size) for _ in range(cfg.num_layers)])
            for _ in range(cfg.num_heads)
        )
        self.lm_head = (
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if cfg.trainable_lm_head
            else None
        )

    @torch.no_grad()
    def load_lm_head(self, weight: torch.Tensor) -> None:
        """Initialise the trainable LM head from the target's (V, d) head weight."""
        if self.lm_head is None:
            raise ValueError("load_lm_head needs trainable_lm_head=True")
        self.lm_head.weight.copy_(weight)

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, T, d) -> pre-LM-head states (B, T, K, d); slot i is head i."""
        return torch.stack([head(features) for head in self.heads], dim=2)

    def forward(self, features: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """features (B, T, d) -> logits (B, T, K, V); logits[:, t, i] predict token t+2+i.

        `lm_head` is the target's frozen head; it is ignored when the module owns a trainable
        copy (`trainable_lm_head=True`).
        """
        head = self.lm_head if self.lm_head is not None else lm_head
        if head is None:
            raise ValueError("pass the target's lm_head (trainable_lm_head=False)")
        return head(self.hidden(features))  # (B, T, K, V)
