"""What every head drafter (Medusa, Cerberus) shares: the LM head on top of its hidden states.

A head drafter maps f_t (B, T, d) to K pre-LM-head states (B, T, K, d) (`hidden`, per model);
slot i predicts token t+2+i through the target's frozen LM head, passed in at call time, or
through a trainable copy the module owns (`trainable_lm_head=True`, set by `load_lm_head`).
"""

from __future__ import annotations

import torch
from torch import nn


class HeadDrafter(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        self.lm_head = (
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if cfg.trainable_lm_head
            else None
        )

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def load_lm_head(self, weight: torch.Tensor) -> None:
        """Initialise the trainable LM head from the target's (V, d) head weight."""
        if self.lm_head is None:
            raise ValueError("load_lm_head needs trainable_lm_head=True")
        self.lm_head.weight.copy_(weight)

    def forward(self, features: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """features (B, T, d) -> logits (B, T, K, V); logits[:, t, i] predict token t+2+i.

        `lm_head` is the target's frozen head; it is ignored when the module owns a trainable
        copy (`trainable_lm_head=True`).
        """
        head = self.lm_head if self.lm_head is not None else lm_head
        if head is None:
            raise ValueError("pass the target's lm_head (trainable_lm_head=False)")
        return head(self.hidden(features))  # (B, T, K, V)
