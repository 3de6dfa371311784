"""Cerberus heads (docs/design.md section 3): sequential knowledge between heads, run in parallel.

    u_i^(0) = f_t                                               for all heads i
    u_i^(l) = P_i^(l) x + SiLU(W_i^(l) x + b_i^(l)),  x = [u_i^(l-1) ; u_{i-1}^(l-1)],  u_{-1} = f_t
    logits_i = LM(u_i^(L))                            head i predicts token t+2+i

Layer l of every head reads only layer l-1, so one layer of all K heads is one batched matmul
over weights stored as (K, 2d, d); the critical path is L blocks, not K. Through the chain
u_{i-1} -> u_i, head i sees the hidden state of head i-j after j layers (j < L).

P is the fixed selector [I 0] (the residual is u_i^(l-1)) or a learned 2d -> d projection
initialised to [I 0] (`learned_residual=True`). W and b start at zero, so every head starts as
the identity on f_t, like a Medusa head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from drafters.models.heads import HeadDrafter


@dataclass(frozen=True)
class CerberusConfig:
    hidden_size: int  # d
    vocab_size: int  # V, the target's vocabulary
    num_heads: int = 4  # K: head i predicts token t+2+i
    num_layers: int = 2  # L; head i hears head i-1 only from layer 2 on, so use L >= 2
    learned_residual: bool = False  # P learned (2d -> d) instead of the fixed selector [I 0]
    trainable_lm_head: bool = False
    draft_vocab_size: int | None = None  # V_d: score only these target ids (models/vocab.py)

    def num_params(self) -> int:
        """L * K * (2d^2 + d)  [+ L * K * 2d^2 learned residual]  [+ V * d trainable LM head]."""
        d, lk = self.hidden_size, self.num_layers * self.num_heads
        n = lk * (2 * d * d + d)
        n += lk * 2 * d * d if self.learned_residual else 0
        rows = self.draft_vocab_size or self.vocab_size  # the trainable head's rows
        return n + (rows * d if self.trainable_lm_head else 0)


def num_params(cfg: CerberusConfig) -> int:
    """See `CerberusConfig.num_params`: L*K*(2d^2 + d) [+ L*K*2d^2] [+ V*d]."""
    return cfg.num_params()


class CerberusLayer(nn.Module):
    """Layer l of all K heads; parameters of head i are slice i of each (K, ...) tensor."""

    def __init__(self, num_heads: int, hidden_size: int, learned_residual: bool):
        super().__init__()
        k, d = num_heads, hidden_size
        self.weight = nn.Parameter(torch.zeros(k, 2 * d, d))  # W^T: x @ weight[i]
        self.bias = nn.Parameter(torch.zeros(k, d))
        self.proj = None
        if learned_residual:  # P^T, initialised to the selector [I 0]^T
            self.proj = nn.Parameter(torch.eye(2 * d, d).expand(k, 2 * d, d).clone())

    def forward(self, u: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """u (B, T, K, d) layer l-1 of every head, f (B, T, d) -> layer l (B, T, K, d)."""
        prev = torch.cat([f.unsqueeze(2), u[:, :, :-1]], dim=2)  # (B, T, K, d): u_{i-1}
        x = torch.cat([u, prev], dim=-1)  # (B, T, K, 2d)
        h = torch.einsum("btkc,kcd->btkd", x, self.weight) + self.bias  # one bmm over K
        res = u if self.proj is None else torch.einsum("btkc,kcd->btkd", x, self.proj)
        return res + F.silu(h)


class CerberusHeads(HeadDrafter):
    def __init__(self, cfg: CerberusConfig):
        super().__init__(cfg)
        self.layers = nn.ModuleList(
            CerberusLayer(cfg.num_heads, cfg.hidden_size, cfg.learned_residual)
            for _ in range(cfg.num_layers)
        )

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, T, d) -> pre-LM-head states u^(L) (B, T, K, d); slot i is head i."""
        B, T, d = features.shape
        u = features.unsqueeze(2).expand(B, T, self.num_heads, d)  # u^(0) = f_t for every head
        for layer in self.layers:
            u = layer(u, features)
        # einsum returns a (K, B, T, d)-strided view; a non-contiguous input would send the
        # LM head down a batched-matmul path that is ~5x slower (and so would its backward)
        return u.contiguous()
