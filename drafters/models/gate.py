"""Cerberus gates (docs/design.md section 3): predict the accepted length E[a] of a tree step.

Both gates read the target's current step: its post-norm feature f_t and its logits p_t (already
computed by the last forward). They return E[a], the expected number of accepted draft tokens
along the heads' top-1 chain; the decoder speculates iff E[a] > c_tree / c_ar - 1 with costs it
measures itself. No threshold lives here.

- `EntropyGate` (the paper's signal): E[a] = calibration(H(p_t)), a piecewise-constant map from
  entropy bins to the mean accepted length measured on validation data (`fit`).
- `LearnedGate` (ours): an MLP on [f_t ; H(p_t)] giving, for each head i, the logit of
  P(heads 0..i all correct); E[a] = sum_i sigmoid(logit_i). Trained with BCE on `gate_labels`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) over the last dim, in float32: (..., V) -> (...)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def gate_labels(
    head_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Labels of the learned gate: y[b, t, i] = 1 iff heads 0..i are all top-1 correct.

    head_logits (B, T, K, V); labels (B, T, K) token ids (head i at t: t_{t+2+i});
    mask (B, T, K) True where labels[..., i] is a real label. A head without a label counts as
    wrong, so y is 0 from there on; train only where `mask.cumprod(-1)` (heads 0..i labelled).
    Returns float (B, T, K); y.sum(-1) is the accepted length of the top-1 chain.
    """
    correct = (head_logits.argmax(-1) == labels) & mask.bool()  # (B, T, K)
    return correct.long().cumprod(-1).to(torch.float32)


class EntropyGate(nn.Module):
    """E[a] from the target's entropy through a calibration table held as buffers.

    `edges` (num_bins - 1,) are the inner entropy bin edges (nats), `values` (num_bins,) the mean
    accepted length per bin. Before `fit`, edges split [0, max_entropy] evenly and values fall
    linearly from num_heads (H = 0) to 0 (H = max_entropy): a prior that only says "lower
    entropy, more accepted tokens". Fit it on validation data before trusting the numbers.
    Everything is in `state_dict` (`fitted` says whether `fit` ran).
    """

    def __init__(self, num_heads: int = 4, num_bins: int = 32, max_entropy: float = 8.0):
        super().__init__()
        self.num_heads = num_heads
        edges = torch.linspace(0.0, max_entropy, num_bins + 1)
        centres = (edges[1:] + edges[:-1]) / 2
        self.register_buffer("edges", edges[1:-1].clone())  # (num_bins - 1,)
        self.register_buffer("values", num_heads * (1 - centres / max_entropy))  # (num_bins,)
        self.register_buffer("fitted", torch.tensor(False))

    def calibrate(self, h: torch.Tensor) -> torch.Tensor:
        """Entropy (...) -> E[a] (...)."""
        idx = torch.bucketize(h.float().contiguous(), self.edges)
        return self.values[idx]

    def expected_accept(
        self, features: torch.Tensor | None, target_logits: torch.Tensor
    ) -> torch.Tensor:
        """features (..., d) (unused), target_logits (..., V) -> E[a] (...)."""
        return self.calibrate(entropy(target_logits))

    def forward(self, features: torch.Tensor | None, target_logits: torch.Tensor) -> torch.Tensor:
        return self.expected_accept(features, target_logits)

    @torch.no_grad()
    def fit(self, entropy: torch.Tensor, accepted_len: torch.Tensor, monotone: bool = True):
        """Refit the table: equal-count entropy bins, mean accepted length per bin.

        entropy, accepted_len: (N,) one entry per measured speculation step. With `monotone`,
        values are made non-increasing in entropy (weighted pool-adjacent-violators), so that
        "E[a] > c" is exactly "H < some threshold", as in the paper's gate.
        """
        h, a = entropy.flatten().float().cpu(), accepted_len.flatten().float().cpu()
        nb = self.values.numel()
        q = torch.linspace(0, 1, nb + 1)[1:-1]
        edges = torch.quantile(h, q) if h.numel() else self.edges.cpu()
        idx = torch.bucketize(h, edges)
        count = torch.zeros(nb).index_add_(0, idx, torch.ones_like(a))
        total = torch.zeros(nb).index_add_(0, idx, a)
        values = total / count.clamp(min=1)
        # empty bins (ties in the quantiles) borrow their left neighbour, with ~zero weight
        for i in range(nb):
            if count[i] == 0:
                values[i] = values[i - 1] if i > 0 else (a.mean() if a.numel() else 0.0)
        if monotone:
            values = _non_increasing(values, count.clamp(min=1e-6))
        self.edges.copy_(edges.to(self.edges))
        self.values.copy_(values.to(self.values))
        self.fitted.fill_(True)
        return self


def _non_increasing(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weighted isotonic (non-increasing) regression by pool-adjacent-violators."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for x, wx in zip(v.tolist(), w.tolist(), strict=True):
        blocks.append([x, wx, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return torch.tensor([m for m, _, n in blocks for _ in range(n)])


@dataclass(frozen=True)
class LearnedGateConfig:
    hidden_size: int  # d
    num_heads: int  # K: one output per head
    hidden_dim: int = 256  # width of the MLP

    def num_params(self) -> int:
        """(d + 1) * h + h + h * K + K: Linear(d+1, h), SiLU, Linear(h, K)."""
        d, h, k = self.hidden_size, self.hidden_dim, self.num_heads
        return (d + 1) * h + h + h * k + k


class LearnedGate(nn.Module):
    """MLP on [f_t ; H(p_t)] -> logits of P(heads 0..i correct), i = 0..K-1.

    The K outputs are independent sigmoids (not constrained to be non-increasing in i); the BCE
    labels are nested, and E[a] is their sum.
    """

    def __init__(self, cfg: LearnedGateConfig):
        super().__init__()
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        self.fc1 = nn.Linear(cfg.hidden_size + 1, cfg.hidden_dim)
        self.fc2 = nn.Linear(cfg.hidden_dim, cfg.num_heads)

    def forward(
        self,
        features: torch.Tensor,
        target_logits: torch.Tensor | None = None,
        target_entropy: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """features (..., d), target_logits (..., V) [or their entropy (...)] -> logits (..., K)."""
        if target_entropy is None:
            if target_logits is None:
                raise ValueError("LearnedGate needs target_logits or their entropy")
            target_entropy = entropy(target_logits)
        x = torch.cat([features, target_entropy.unsqueeze(-1).to(features.dtype)], dim=-1)
        return self.fc2(F.silu(self.fc1(x)))

    def expected_accept(self, features: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
        """features (..., d), target_logits (..., V) -> E[a] = sum_i P(heads 0..i correct) (...)."""
        return torch.sigmoid(self.forward(features, target_logits).float()).sum(-1)
