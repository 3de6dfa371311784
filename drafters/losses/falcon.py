"""Falcon loss (docs/design.md section 4) and the input-feature noise.

Per valid position j (labels f_{j+k} and t_{j+k+1}; valid iff loss_mask[j+k] and
loss_mask[j+k+1], see `labels.py`):

    L_j = SmoothL1(f̂_j, f_{j+k}) + 0.1 * [0.9 * KL(p_target || p_draft) + 0.1 * CE(t_{j+k+1})]

SmoothL1 is averaged over the d features; p_target = softmax(target_logits[j+k]) (or of
lm_head(f_{j+k}) when no logits are given), p_draft = softmax(lm_head(f̂_j)). L is the mean of
L_j over all valid positions of the batch (or of each sequence, with per_sequence).

With a draft vocabulary (docs/design.md section 10) `lm_head` is its V_d rows of the target's
head: p_target is the target's distribution restricted to those ids and renormalised, and the
CE term is taken where t_{j+k+1} is one of them (the others are counted in `oov_rate`; they can
never be drafted, so they count as misses in the accuracies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafters.losses.labels import default_position_ids, span_valid
from drafters.models.vocab import DraftVocab


def falcon_valid(loss_mask: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) bool: position j is trained (labels f_{j+k}, t_{j+k+1} exist and are generated)."""
    return span_valid(loss_mask, k, k + 1)


def add_feature_noise(
    features: torch.Tensor,
    scale: float = 0.1,
    kind: str = "uniform",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """features + noise: U(-scale, scale) (kind="uniform", the paper's U(-0.1, 0.1)) or
    N(0, scale^2) (kind="normal"). EAGLE's code uses uniform with scale 0.1 * 512 / seq_len.
    Apply to the drafter's *input* features only, never to the regression targets."""
    if scale == 0:
        return features
    dev = generator.device if generator is not None else features.device
    shape = features.shape
    if kind == "uniform":
        noise = (torch.rand(shape, generator=generator, device=dev) * 2 - 1) * scale
    elif kind == "normal":
        noise = torch.randn(shape, generator=generator, device=dev) * scale
    else:
        raise ValueError(f"noise kind must be 'uniform' or 'normal', not {kind!r}")
    return features + noise.to(features.device, features.dtype)


def block_offset(position_ids: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) offset p in 1..k of the token predicted at j, counted from the block's last known
    token: j = block start + (p - 1) predicts the p-th token after the block."""
    return position_ids % k + 1


def falcon_loss(
    pred_features: torch.Tensor,
    target_features: torch.Tensor,
    lm_head: nn.Module,
    target_logits: torch.Tensor | None,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    k: int,
    *,
    position_ids: torch.Tensor | None = None,
    include: torch.Tensor | None = None,
    metric_mask: torch.Tensor | None = None,
    per_sequence: bool = False,
    w_logit: float = 0.1,
    w_kl: float = 0.9,
    tag: str = "",
    vocab: DraftVocab | None = None,
    accuracy: bool = True,
    return_drafts: bool = False,
):
    """pred_features (B, T, d) drafter outputs; target_features (B, T, d) the true f;
    target_logits (B, T, V) (the full vocabulary) or None; input_ids, loss_mask (B, T).
    lm_head: the drafter's scoring head (with `vocab`, its V_d rows of the target's head).

    position_ids (B, T) place positions in their blocks for acc_pos{p} (default: arange).
    include (B, T) bool further restricts the positions in the loss (CSGD's glance switch);
    metric_mask (B, T) bool restricts the accuracy metrics to some of those positions.
    accuracy=False leaves out the argmax and the acc metrics (steps that do not log them).
    Returns (loss, metrics): loss scalar (or (B,) per_sequence); metrics (pooled, detached)
    `acc{tag}_pos{p}` for p = 1..k, `acc{tag}`, loss_feat, loss_kl, loss_ce, oov_rate.
    return_drafts=True: (loss, metrics, drafts), drafts (B, T) the top-1 draft (target id) at
    every position in the loss, -1 elsewhere (the argmax is taken even with accuracy=False).
    """
    B, T, _ = pred_features.shape
    valid = falcon_valid(loss_mask, k)
    if include is not None:
        valid = valid & include
    if position_ids is None:
        position_ids = default_position_ids(None, input_ids)
    b, j = valid.nonzero(as_tuple=True)  # (N,) each
    pred = pred_features[b, j]  # (N, d)
    feat = target_features[b, j + k].to(pred.dtype)  # (N, d): f_{j+k}
    tok = input_ids[b, j + k + 1]  # (N,): t_{j+k+1}
    if vocab is not None:
        tok = vocab.to_draft(tok)  # -1 outside the draft vocabulary
    known = tok >= 0
    sl1 = F.smooth_l1_loss(pred.float(), feat.float(), reduction="none").mean(-1)  # (N,)
    logp = F.log_softmax(lm_head(pred).float(), dim=-1)  # (N, V or V_d)
    with torch.no_grad():
        if target_logits is None:
            tl = lm_head(feat)
        else:
            tl = target_logits[b, j + k]
            tl = tl if vocab is None else tl[:, vocab.ids.to(tl.device)]
        logp_t = F.log_softmax(tl.float(), dim=-1)  # restricted and renormalised with a vocab
    kl = (logp_t.exp() * (logp_t - logp)).sum(-1)  # (N,)
    ce = F.nll_loss(logp, tok.clamp(min=0), reduction="none") * known  # (N,) 0 where unknown
    per_pos = sl1 + w_logit * (w_kl * kl + (1 - w_kl) * ce)  # (N,)
    n = max(len(per_pos), 1)
    if per_sequence:
        count = torch.zeros(B, device=per_pos.device).index_add_(0, b, torch.ones_like(per_pos))
        loss = torch.zeros(B, device=per_pos.device).index_add_(0, b, per_pos)
        loss = loss / count.clamp(min=1)
    else:
        loss = per_pos.sum() / n
    if len(per_pos) == 0:  # keep the graph connected so backward() still works
        loss = loss + 0.0 * pred_features.sum()
    nk = known.sum().clamp(min=1)
    metrics = {"loss_feat": sl1.sum() / n, "loss_kl": kl.sum() / n, "loss_ce": ce.sum() / nk}
    metrics["oov_rate"] = (~known).sum().float() / n
    if accuracy or return_drafts:
        top = logp.detach().argmax(-1)  # (N,) draft-vocabulary ids
    if accuracy:
        hit = (top == tok) & known
        sel = metric_mask[b, j] if metric_mask is not None else torch.ones_like(hit)
        metrics.update(block_accuracy(hit, block_offset(position_ids[b, j], k), k, tag, sel))
    metrics = {name: v.detach().float() for name, v in metrics.items()}
    if not return_drafts:
        return loss, metrics
    drafts = torch.full_like(input_ids, -1)
    drafts[b, j] = top if vocab is None else vocab.to_target(top)
    return loss, metrics, drafts


def block_accuracy(
    hit: torch.Tensor,
    offset: torch.Tensor,
    k: int,
    tag: str = "",
    select: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """hit, offset, select (N,) -> `acc{tag}` and `acc{tag}_pos{p}` (top-1 accuracy of the
    selected positions predicting offset p = 1..k), 0 where nothing is selected."""
    select = torch.ones_like(hit) if select is None else select.bool()
    out = {f"acc{tag}": (hit & select).sum().float() / select.sum().clamp(min=1)}
    for p in range(1, k + 1):
        sel = select & (offset == p)
        out[f"acc{tag}_pos{p}"] = (hit & sel).sum().float() / sel.sum().clamp(min=1)
    return out
