"""What every head drafter (Medusa, Cerberus) shares: the LM head on top of its hidden states.

A head drafter maps f_t (B, T, d) to K pre-LM-head states (B, T, K, d) (`hidden`, per model);
slot i predicts token t+2+i through the target's frozen LM head, passed in at call time, or
through a trainable copy the module owns (`trainable_lm_head=True`, set by `load_lm_head`).
With `draft_vocab_size` set, logits are over the draft vocabulary only (`drafters.models.vocab`):
the V_d rows of the target's head (or a trainable copy of those rows); index i is target token
`vocab.ids[i]`.
"""

from __future__ import annotations

import torch
from torch import nn

from drafters.models.vocab import DraftVocab, output_head


class HeadDrafter(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        size = cfg.draft_vocab_size
        self.vocab = DraftVocab(cfg.vocab_size, size) if size else None
        self.lm_head = (
            nn.Linear(cfg.hidden_size, size or cfg.vocab_size, bias=False)
            if cfg.trainable_lm_head
            else None
        )

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def load_lm_head(self, weight: torch.Tensor) -> None:
        """Initialise the trainable LM head from the target's (V, d) head weight (its draft
        vocabulary rows, with one)."""
        if self.lm_head is None:
            raise ValueError("load_lm_head needs trainable_lm_head=True")
        if self.vocab is not None:
            weight = weight.index_select(0, self.vocab.ids.to(weight.device))
        self.lm_head.weight.copy_(weight)

    def scoring_head(self, lm_head: nn.Module | None) -> nn.Module:
        """The head that turns `hidden` into logits: the trainable copy if the module owns one,
        else the target's `lm_head` (its draft-vocabulary rows, with a draft vocabulary)."""
        if self.lm_head is not None:
            return self.lm_head
        if lm_head is None:
            raise ValueError("pass the target's lm_head (trainable_lm_head=False)")
        return output_head(self.vocab, lm_head)

    def forward(self, features: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """features (B, T, d) -> logits (B, T, K, V or V_d); logits[:, t, i] predict token t+2+i.

        `lm_head` is the target's frozen head; it is ignored when the module owns a trainable
        copy (`trainable_lm_head=True`). With a draft vocabulary, logit j is target token
        `self.vocab.ids[j]`.
        """
        return self.scoring_head(lm_head)(self.hidden(features))
