"""Medusa/Cerberus loss: decayed per-head cross-entropy, plus the learned gate's BCE.

    L = sum_i decay^i * CE_i  [+ sum_i BCE_i(gate)]

CE_i is the mean over the valid positions of head i (pooled over the batch): head i at position
t is labelled t_{t+2+i} = input_ids[:, t+2+i] and valid iff loss_mask[t+1 .. t+2+i] are all 1
(see `labels.py`: the target's next token and the label are generated tokens of one response).
With a draft vocabulary (docs/design.md section 10) the CE is over its V_d ids, on the labels in
it; the others are counted (`oov_rate`) and scored as misses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafters.losses.labels import shift_left, span_valid
from drafters.models.vocab import DraftVocab


def head_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, num_heads: int):
    """labels (B, T, K) with labels[:, t, i] = input_ids[:, t+2+i], and valid (B, T, K) bool."""
    labels = torch.stack([shift_left(input_ids, 2 + i) for i in range(num_heads)], dim=-1)
    valid = torch.stack([span_valid(loss_mask, 1, 2 + i) for i in range(num_heads)], dim=-1)
    return labels, valid


def heads_loss(
    head_out: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    decay: float = 0.8,
    gate_logits: torch.Tensor | None = None,
    per_sequence: bool = False,
    *,
    head: nn.Module | None = None,
    vocab: DraftVocab | None = None,
    accuracy: bool = True,
    return_correct: bool = False,
):
    """head_out: logits (B, T, K, V) or, with `head`, pre-LM-head states (B, T, K, d) that are
    projected at the labelled rows only (the cheap path: no logits for unlabelled positions).
    input_ids, loss_mask (B, T); gate_logits (B, T, K) or None.

    vocab: the drafter's draft vocabulary; logits are then over its V_d ids, a label outside it
    is left out of the CE (it can never be drafted) but counted as a miss in the accuracies.
    accuracy=False skips the argmax (acc_head{i} are not returned) unless the gate needs it.

    Returns (loss, metrics) [, correct (B, T, K) bool with return_correct]. loss is a scalar
    pooled over the batch, or (B,) with per_sequence (each sequence's own means, so a
    sequence's loss does not depend on its batch-mates). metrics (detached, pooled): loss_head{i}
    and acc_head{i} (CE / top-1 accuracy of head i), oov_rate (labels outside the draft
    vocabulary), and with a gate gate_bce (sum over heads) and gate_calib = mean predicted E[a]
    - mean actual top-1 chain acceptance, over positions where all K heads are labelled.
    """
    B, T, K, _ = head_out.shape
    labels, valid = head_labels(input_ids, loss_mask, K)
    b, t, i = valid.nonzero(as_tuple=True)  # (N,) each: one gather for all heads
    rows = head_out[b, t, i]  # (N, V) or (N, d): labelled rows only
    logits = (head(rows) if head is not None else rows).float()  # (N, V or V_d)
    target = labels[b, t, i]  # (N,) target ids
    if vocab is not None:
        target = vocab.to_draft(target)  # -1 outside the draft vocabulary
    known = target >= 0
    ce = F.cross_entropy(logits, target.clamp(min=0), reduction="none") * known  # (N,)
    weights = decay ** torch.arange(K, device=ce.device, dtype=ce.dtype)  # (K,)
    group = b * K + i if per_sequence else i  # mean CE per (sequence, head) or per head
    n_groups = B * K if per_sequence else K
    kf = known.to(ce.dtype)
    count = torch.zeros(n_groups, device=ce.device).index_add_(0, group, kf)
    mean_ce = torch.zeros(n_groups, device=ce.device).index_add_(0, group, ce)
    mean_ce = mean_ce / count.clamp(min=1)
    loss = (mean_ce.view(-1, K) * weights).sum(-1)  # (B,) or (1,)
    loss = loss if per_sequence else loss[0]
    if not bool(known.any()):  # keep the graph connected so backward() still works
        loss = loss + 0.0 * head_out.sum()
    head_known = torch.zeros(K, device=ce.device).index_add_(0, i, kf).clamp(min=1)
    head_ce = torch.zeros(K, device=ce.device).index_add_(0, i, ce.detach()) / head_known
    metrics: dict[str, torch.Tensor] = {}
    for h in range(K):
        metrics[f"loss_head{h}"] = head_ce[h]
    metrics["oov_rate"] = (~known).sum().float() / max(len(known), 1)
    correct = None
    if accuracy or gate_logits is not None or return_correct:
        hit = (logits.argmax(-1) == target) & known  # (N,) an unknown label is a miss
        head_count = torch.bincount(i, minlength=K).clamp(min=1)
        head_acc = torch.zeros(K, device=ce.device).index_add_(0, i, hit.float()) / head_count
        for h in range(K):
            metrics[f"acc_head{h}"] = head_acc[h]
        correct = torch.zeros(B, T, K, dtype=torch.bool, device=head_out.device)
        correct[b, t, i] = hit
    if gate_logits is not None:
        y = correct.long().cumprod(-1).float()  # (B, T, K): heads 0..i all right (gate_labels)
        w = valid.long().cumprod(-1).float()  # heads 0..i all labelled
        bce = F.binary_cross_entropy_with_logits(gate_logits.float(), y, reduction="none")
        dims = (1,) if per_sequence else (0, 1)
        per_head = (bce * w).sum(dims) / w.sum(dims).clamp(min=1)  # (B, K) or (K,)
        gate_loss = per_head.sum(-1)
        loss = loss + gate_loss
        full = w[..., -1].bool()  # (B, T): all K heads labelled
        pred_len = torch.sigmoid(gate_logits.float()).sum(-1)[full]
        true_len = y.sum(-1)[full]
        nf = full.sum().clamp(min=1)
        metrics["gate_bce"] = (gate_loss.mean() if per_sequence else gate_loss).detach()
        metrics["gate_calib"] = ((pred_len.sum() - true_len.sum()) / nf).detach()
    if return_correct:
        return loss, metrics, correct
    return loss, metrics
