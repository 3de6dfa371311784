"""Coupled Sequential Glancing Distillation (docs/design.md section 4), batched, any padding.

At decoding time only the first drafter pass reads true target pairs; later passes read the
drafter's own predicted (feature, token) pairs. CSGD trains on such inputs, in two variants.

variant="decode" (default): trained the way it is decoded (`own_blocks.py`).
  loss = teacher-forced loss (pass 1, true inputs, with gradient)
       + own_pass_weight * sum over passes c = 2 .. `passes` of the pass-c loss,
  where pass c is one forward over a copy of the sequence on the drafter's KV cache: the
  drafter's own pairs only in the block being predicted and its ancestor blocks, attending to
  the true keys of every earlier position, as EAGLE-3's training-time test and HASS do. The
  glancing below applies to those own blocks (pass c's Hamming distance counts pass c-1's
  wrong drafts), and pass c's loss covers its candidate positions (glanced ones included unless
  loss_on_glanced=False). Linear fusion only (an LSTM would need its state at every block).
  Metrics: `acc_depth{d}` for d = 1 .. k * passes, the decode-faithful chain rates (see
  `own_blocks.depth_counts`), and `acc_pass{c}[_pos{p}]` on pass-c positions with own inputs.

variant="paper" (the paper's text, kept for the ablation): pass 1 without gradient, then pass 2
on the whole sequence of own pairs, as follows.

1. Pass 1, no gradient, true inputs (f_j, t_{j+1}) (+ noise): output j predicts f_{j+k} and
   t_{j+k+1}. It therefore provides the *own pair* of input position m = j + k:
       own(m) = (f̂_m, t̂_{m+1}) = (out1[m-k], argmax lm_head(out1[m-k]))   (coupled by design)
2. Hamming distance per sequence: d = #{valid j : t̂_{j+k+1} != t_{j+k+1}} (valid as in
   `falcon_loss`: generated labels only, never padding).
3. Pass-2 inputs: own(m) at every candidate m (m = j + k for a valid j: a generated position
   whose pair the drafter predicted), the true pair elsewhere (prompt, user turns, the first k
   positions, padding), as at decoding time where the prompt is always true. Then glance:
   N = floor(lam * d + 0.5) candidates get their true pair back, feature and token together,
   as contiguous runs that end right before a predicted block: aligned blocks of k are taken
   in a random order (from `generator`), each from its end backwards, until N positions are
   chosen; the last block may be partial, keeping its tail.

       k = 2, candidates m = 2..9 (o = own pair, T = true pair)
       m            0 1 | 2 3 | 4 5 | 6 7 | 8 9      (| = aligned block boundary)
       pass 1 in    T T | T T | T T | T T | T T
       pass 2, N=0  T T | o o | o o | o o | o o
       pass 2, N=3  T T | o o | T T | o T | o o      ([4 5] whole, then the tail of [6 7])

4. Pass 2 with gradient, `falcon_loss` against the true f_{j+k}, t_{j+k+1}. With
   loss_on_glanced=False, outputs at glanced input positions (whose input pair was true) are
   left out of the loss (GLAT-style).

`teacher_forcing_only=True` skips all of it: one pass with gradient on true inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from drafters.losses.falcon import (
    add_feature_noise,
    block_accuracy,
    block_offset,
    falcon_loss,
    falcon_valid,
)
from drafters.losses.labels import default_position_ids, shift_left
from drafters.losses.own_blocks import depth_accuracy, depth_counts, own_block_bias
from drafters.models.vocab import DraftVocab, to_target

VARIANTS = ("decode", "paper")


def csgd_lambda(progress: float, start: float = 0.4, end: float = 0.0) -> float:
    """Glance ratio at training progress in [0, 1]: linear from `start` to `end` (paper:
    0.4 -> 0 over the epochs; the released code uses 0.45 -> 0.10)."""
    p = min(max(float(progress), 0.0), 1.0)
    return start + (end - start) * p


def _shift_right(x: torch.Tensor, n: int) -> torch.Tensor:
    """y[:, m] = x[:, m-n]; the first n positions are zero/False."""
    return torch.cat([torch.zeros_like(x[:, :n]), x[:, : x.shape[1] - n]], dim=1)


def choose_glance(
    candidates: torch.Tensor,
    n: torch.Tensor,
    position_ids: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(B, T) bool: n[b] candidate positions per row, in runs ending at aligned block ends.

    Blocks (position_ids // k) get a random rank per row; candidates are ordered by (block
    rank, distance to the block's end) and the first n[b] are glanced.
    """
    B, T = candidates.shape
    blk = position_ids // k  # (B, T)
    nblk = int(blk.max()) + 1 if T else 1
    dev = generator.device if generator is not None else candidates.device
    r = torch.rand(B, nblk, generator=generator, device=dev).to(candidates.device)
    rank = r.argsort(-1).argsort(-1)  # (B, nblk): random block order
    key = rank.gather(1, blk) * k + (k - 1 - position_ids % k)  # block order, tail first
    key = key.masked_fill(~candidates, (nblk + 1) * k)
    place = key.argsort(dim=-1, stable=True).argsort(dim=-1)  # (B, T): place of m in that order
    return candidates & (place < n.unsqueeze(-1))


class Pass2Inputs(NamedTuple):
    features: torch.Tensor  # (B, T, d) pass-2 input features
    next_tokens: torch.Tensor  # (B, T) pass-2 input tokens (t_{m+1} slot)
    own: torch.Tensor  # (B, T) bool: input is the drafter's own pair
    glanced: torch.Tensor  # (B, T) bool: candidate given back its true pair
    hamming: torch.Tensor  # (B,) d
    n_glance: torch.Tensor  # (B,) N


def pass2_inputs(
    pred1: torch.Tensor,
    tok1: torch.Tensor,
    features: torch.Tensor,
    next_tokens: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor,
    k: int,
    lam: float,
    generator: torch.Generator | None = None,
) -> Pass2Inputs:
    """pred1 (B, T, d) pass-1 outputs, tok1 (B, T) their argmax tokens (read at valid j only);
    features/next_tokens (B, T, .) the true pass-1 inputs. See the module docstring."""
    valid = falcon_valid(loss_mask, k)  # (B, T): output j is compared with t_{j+k+1}
    wrong = valid & (tok1 != shift_left(input_ids, k + 1))
    hamming = wrong.sum(-1)  # (B,)
    cand = _shift_right(valid, k)  # input m = j + k holds own(m) from output j
    n = torch.floor(lam * hamming.double() + 0.5).long()
    n = torch.minimum(n, cand.sum(-1))
    glanced = choose_glance(cand, n, position_ids, k, generator)
    own = cand & ~glanced
    f2 = torch.where(own.unsqueeze(-1), _shift_right(pred1, k).to(features.dtype), features)
    t2 = torch.where(own, _shift_right(tok1, k), next_tokens)
    return Pass2Inputs(f2, t2, own, glanced, hamming, n)


def csgd_step(
    drafter: nn.Module,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    loss_mask: torch.Tensor,
    embed: nn.Embedding,
    lm_head: nn.Module,
    k: int,
    lam: float,
    teacher_forcing_only: bool = False,
    loss_on_glanced: bool = True,
    generator: torch.Generator | None = None,
    target_logits: torch.Tensor | None = None,
    *,
    noise: float = 0.0,
    per_sequence: bool = False,
    vocab: DraftVocab | None = None,
    accuracy: bool = True,
    variant: str = "decode",
    passes: int = 2,
    own_pass_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One Falcon training loss on a batch: features (B, T, d) true f (wide with the drafter's
    aux_layers, `drafters.target.with_aux`), input_ids,
    attention_mask, loss_mask (B, T). `noise`: half-width of the uniform noise added to true
    input features (targets stay clean). lm_head: the drafter's scoring head; with `vocab` (the
    draft vocabulary) its V_d rows, and pass 1's argmax is mapped back to target ids.
    accuracy=False: no accuracy metrics (pass 1's argmax is still taken: pass 2 reads it).
    variant: "decode" or "paper" (module docstring); passes: drafter passes trained by the
    decode variant (2 = the teacher-forced pass and one own-block pass); own_pass_weight: the
    weight of each own-block pass's loss against the teacher-forced one (0: teacher forcing's
    loss, with the own-block passes measured only).
    Returns (loss, metrics) with the keys of
    `falcon_loss` (decode: of the teacher-forced pass; paper: of pass 2, acc_pos{p} from the
    teacher-forced pass) plus acc_pass2[_pos{p}] (pass-2 positions whose input is the
    drafter's own pair), hamming (mean d per sequence), hamming_rate (sum d / valid positions),
    glance_ratio (sum N / sum d); decode also acc_depth{d}, acc_pass{c}[_pos{p}], loss_pass{c}."""
    if variant not in VARIANTS:
        raise ValueError(f"csgd.variant={variant!r}: use one of {VARIANTS}")
    pos = default_position_ids(attention_mask, input_ids)  # same as the drafter's default
    nxt = shift_left(input_ids, 1)  # t_{j+1} at position j
    # true inputs: f, or EAGLE-3's fused features from wide ones (FalconDrafter.inputs); the
    # targets are always f
    inputs = drafter.inputs(features) if hasattr(drafter, "inputs") else features
    features = features[..., : inputs.shape[-1]]
    x1 = add_feature_noise(inputs, noise, generator=generator)
    common = dict(position_ids=pos, per_sequence=per_sequence, vocab=vocab, accuracy=accuracy)
    valid = falcon_valid(loss_mask, k)
    n_valid = valid.sum().clamp(min=1)
    if teacher_forcing_only:
        pred = drafter(x1, nxt, embed, attention_mask, pos)
        loss, m = falcon_loss(
            pred, features, lm_head, target_logits, input_ids, loss_mask, k, **common
        )
        if accuracy:
            m["hamming"] = (1 - m["acc"]) * valid.sum() / input_ids.shape[0]
            m["hamming_rate"] = 1 - m["acc"]
        m["glance_ratio"] = torch.zeros(())
        return loss, m
    if variant == "decode":
        return _decode_step(
            drafter, x1, nxt, features, input_ids, attention_mask, loss_mask, embed, lm_head,
            k, lam, passes, loss_on_glanced, generator, target_logits, pos, common,
            own_pass_weight,
        )  # fmt: skip

    with torch.no_grad():  # pass 1
        pred1 = drafter(x1, nxt, embed, attention_mask, pos)
        b, j = valid.nonzero(as_tuple=True)
        tok1 = torch.zeros_like(input_ids)
        tok1[b, j] = to_target(vocab, lm_head(pred1[b, j]).argmax(-1))
        hit1 = tok1[b, j] == input_ids[b, j + k + 1]
    inp = pass2_inputs(pred1, tok1, x1, nxt, input_ids, loss_mask, pos, k, lam, generator)
    pred2 = drafter(inp.features, inp.next_tokens, embed, attention_mask, pos)  # pass 2
    loss, m = falcon_loss(
        pred2,
        features,
        lm_head,
        target_logits,
        input_ids,
        loss_mask,
        k,
        include=None if loss_on_glanced else ~inp.glanced,
        metric_mask=inp.own,
        tag="_pass2",
        **common,
    )
    if accuracy:
        m.update(block_accuracy(hit1, block_offset(pos[b, j], k), k))
    d, n = inp.hamming.sum(), inp.n_glance.sum()
    m["hamming"] = inp.hamming.float().mean()
    m["hamming_rate"] = d.float() / n_valid
    m["glance_ratio"] = n.float() / d.clamp(min=1)
    return loss, {name: v.detach().float() for name, v in m.items()}


def _decode_step(
    drafter, x1, nxt, features, input_ids, attention_mask, loss_mask, embed, lm_head,
    k, lam, passes, loss_on_glanced, generator, target_logits, pos, common, own_pass_weight,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """variant="decode" (module docstring): the teacher-forced pass, then own-block passes."""
    if getattr(drafter.cfg, "fusion", "linear") == "lstm":
        raise ValueError(
            "csgd.variant=decode needs drafter.model.fusion=linear or eagle3 (an LSTM fusion "
            "would need its recurrent state at every block); use csgd.variant=paper with "
            "fusion=lstm"
        )
    if passes < 2:
        raise ValueError(f"csgd.passes={passes}: the decode variant trains at least 2 passes")
    accuracy = common["accuracy"]
    valid = falcon_valid(loss_mask, k)
    labels = shift_left(input_ids, k + 1)  # t_{j+k+1} at position j
    cache = drafter.new_cache()
    pred = drafter(x1, nxt, embed, attention_mask, pos, cache=cache)  # pass 1: true inputs
    loss, m, drafts = falcon_loss(
        pred, features, lm_head, target_logits, input_ids, loss_mask, k, return_drafts=True,
        **common,
    )  # fmt: skip
    ranks, defined = [(drafts != labels).long()], [valid]
    included = valid
    for c in range(2, passes + 1):
        wrong = included & (drafts != labels)
        hamming = wrong.sum(-1)
        pred, cand, own, n = own_pass(
            drafter, cache, c, pred, drafts, included, x1, nxt, embed, attention_mask, pos, k,
            lam * hamming.double(), generator,
        )  # fmt: skip
        included = cand & valid & (own | loss_on_glanced)
        # the last pass's drafts feed only the metrics: no argmax on steps that log none
        drafted = accuracy or c < passes
        loss_c, m_c, *out = falcon_loss(
            pred, features, lm_head, target_logits, input_ids, loss_mask, k,
            include=included, metric_mask=own, tag=f"_pass{c}", return_drafts=drafted, **common,
        )  # fmt: skip
        loss = loss + own_pass_weight * loss_c
        m[f"loss_pass{c}"] = loss_c.detach().float().mean()
        m.update({name: v for name, v in m_c.items() if name.startswith(f"acc_pass{c}")})
        if drafted:
            drafts = out[0]
            ranks.append((drafts != labels).long())
            defined.append(included & own)  # depth metrics: own inputs only (all at lam 0)
        if c == 2:
            d, n_all = hamming.sum(), n.sum()
            m["hamming"] = hamming.float().mean()
            m["hamming_rate"] = d.float() / valid.sum().clamp(min=1)
            m["glance_ratio"] = n_all.float() / d.clamp(min=1)
    if accuracy:
        m.update(depth_accuracy(*depth_counts(ranks, defined, pos, k)))
    return loss, {name: v.detach().float() for name, v in m.items()}


def own_pass(
    drafter: nn.Module,
    cache,
    copy: int,
    pred: torch.Tensor,
    drafts: torch.Tensor,
    included: torch.Tensor,
    features: torch.Tensor,
    next_tokens: torch.Tensor,
    embed: nn.Embedding,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    k: int,
    glance: torch.Tensor | float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pass `copy` >= 2 of the decode variant on `cache` (which holds copies 1 .. copy-1):
    pred (B, T, d) and drafts (B, T) the previous copy's outputs and top-1 target ids, trusted
    where `included`; features/next_tokens the true inputs. glance (B,) or scalar: lam * d,
    rounded to the number of candidates given their true pair back. Returns (outputs, cand,
    own, n_glanced): cand (B, T) positions whose input can be an own pair, own those that are."""
    cand = _shift_right(included, k)  # input m holds own(m) from the output at m - k
    glance = torch.as_tensor(glance, dtype=torch.float64, device=cand.device)
    n = torch.minimum(torch.floor(glance + 0.5).long().expand(cand.shape[0]), cand.sum(-1))
    own = cand & ~choose_glance(cand, n, position_ids, k, generator)
    f = torch.where(own.unsqueeze(-1), _shift_right(pred.detach(), k).to(features.dtype), features)
    t = torch.where(own, _shift_right(drafts.clamp(min=0), k), next_tokens)
    out = drafter(
        f, t, embed, position_ids=position_ids, cache=cache,
        attn_bias=own_block_bias(position_ids, attention_mask, k, copy), slots=position_ids % k,
    )  # fmt: skip
    return out, cand, own, n
