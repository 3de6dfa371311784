import pytest
import torch
import torch.nn.functional as F
from torch import nn

from drafters.losses import add_feature_noise, falcon_loss, heads_loss, span_valid
from drafters.models import CerberusConfig, CerberusHeads, MedusaConfig, MedusaHeads
from drafters.testing import tiny_target

V = 32


def test_span_valid_hand_built():
    m = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1]])
    assert span_valid(m, 1, 2).long().tolist() == [[0, 1, 1, 0, 0, 1, 0, 0]]
    # falcon k = 2: valid iff m[j+2] and m[j+3]
    assert span_valid(m, 2, 3).long().tolist() == [[1, 1, 0, 0, 1, 0, 0, 0]]


def _offset_logits(ids, offset, K):
    """(1, T, K, V): every head predicts input_ids[t + offset] (token 0 past the end)."""
    shifted = torch.cat([ids[:, offset:], torch.zeros_like(ids[:, :offset])], 1)
    return (F.one_hot(shifted, V).float() * 20).unsqueeze(2).expand(-1, -1, K, -1)


def test_head_i_right_only_at_offset_2_plus_i():
    T, K = 20, 3
    g = torch.Generator().manual_seed(0)
    # distinct tokens, none of them 0 (the "prediction" past the end): one right offset per head
    ids = (torch.randperm(V - 1, generator=g)[:T] + 1).unsqueeze(0)
    mask = torch.ones(1, T)
    for offset in range(1, 6):
        _, m = heads_loss(_offset_logits(ids, offset, K), ids, mask)
        for i in range(K):
            assert m[f"acc_head{i}"].item() == (1.0 if offset == 2 + i else 0.0), (offset, i)


def test_heads_loss_is_decayed_sum_and_padding_never_leaks():
    B, T, K = 2, 10, 3
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, K, V, generator=g)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, :2] = 0  # prompt
    mask[1, 7:] = 0  # padding
    loss, m = heads_loss(logits, ids, mask, decay=0.5)
    want = sum(0.5**i * m[f"loss_head{i}"] for i in range(K))
    torch.testing.assert_close(loss, want)
    logits2, ids2 = logits.clone(), ids.clone()
    logits2[1, 5:] = torch.randn(5, K, V)  # t >= 5 in row 1: no label inside the response
    logits2[:, 0] = 7.0  # t = 0: the target's next token t_1 is a prompt token
    ids2[1, 7:] = 3  # padding tokens
    loss2, m2 = heads_loss(logits2, ids2, mask, decay=0.5)
    torch.testing.assert_close(loss2, loss)
    assert all(torch.equal(m[key], m2[key]) for key in m)


def _ragged(lengths, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        mask[b, 2:n] = 1  # 2 prompt tokens, then the response, then padding
    return ids, mask


@pytest.mark.parametrize("model", ["medusa", "cerberus"])
def test_batch_of_1_equals_batch_of_4_per_sequence(model):
    d, T, lengths = 12, 12, [9, 6, 12, 4]
    torch.manual_seed(0)
    cfg_cls, cls = (
        (MedusaConfig, MedusaHeads) if model == "medusa" else (CerberusConfig, CerberusHeads)
    )
    heads = cls(cfg_cls(d, V, num_heads=3))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)
    lm = nn.Linear(d, V, bias=False)
    f = torch.randn(4, T, d)
    ids, mask = _ragged(lengths, T)
    gate = torch.randn(4, T, 3)
    batch, _ = heads_loss(heads(f, lm), ids, mask, gate_logits=gate, per_sequence=True)
    for b, n in enumerate(lengths):
        one, _ = heads_loss(
            heads(f[b : b + 1, :n], lm),
            ids[b : b + 1, :n],
            mask[b : b + 1, :n],
            gate_logits=gate[b : b + 1, :n],
            per_sequence=True,
        )
        torch.testing.assert_close(batch[b : b + 1], one)


def _self_distilled(B, T, d, seed=0):
    """Features f and ids with t_{j+1} = argmax lm_head(f_j), as greedy self-distillation."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    lm = nn.Linear(d, V, bias=False).requires_grad_(False)
    f = torch.randn(B, T, d, generator=g) * 3
    ids = torch.cat([torch.zeros(B, 1, dtype=torch.long), lm(f).argmax(-1)[:, :-1]], 1)
    return f, ids, lm


@pytest.mark.parametrize("k", [1, 2, 3])
def test_falcon_position_j_is_labelled_f_j_plus_k_and_t_j_plus_k_plus_1(k):
    B, T, d = 2, 12, 8
    f, ids, lm = _self_distilled(B, T, d)
    mask = torch.ones(B, T)
    for shift in (k - 1, k, k + 1):
        pred = torch.cat([f[:, shift:], torch.zeros(B, shift, d)], 1)  # pred_j = f_{j+shift}
        _, m = falcon_loss(pred, f, lm, None, ids, mask, k)
        exact = shift == k
        assert (m["loss_feat"].item() == 0.0) == exact
        assert (m["loss_kl"].abs().item() < 1e-6) == exact
        for p in range(1, k + 1):
            assert (m[f"acc_pos{p}"].item() == 1.0) == exact, (shift, p)
    # target_logits given: p_target at j is read from logits[j + k]
    pred = torch.cat([f[:, k:], torch.zeros(B, k, d)], 1)
    _, m = falcon_loss(pred, f, lm, lm(f), ids, mask, k)
    assert m["loss_kl"].abs().item() < 1e-6


def test_falcon_loss_padding_never_leaks_and_per_sequence():
    B, T, d, k = 2, 12, 8, 2
    f, ids, lm = _self_distilled(B, T, d)
    pred = torch.randn(B, T, d)
    mask = torch.ones(B, T)
    mask[:, :3] = 0
    mask[1, 8:] = 0  # row 1: padding from 8 on -> valid j needs j + 3 <= 7
    loss, m = falcon_loss(pred, f, lm, None, ids, mask, k)
    pred2, f2, ids2 = pred.clone(), f.clone(), ids.clone()
    pred2[1, 5:] = 9.0  # row 1, j >= 5: labels would be padding
    pred2[:, 0] = 9.0  # j = 0: label f_2, t_3 with t_2 a prompt token
    f2[1, 8:] = -9.0
    f2[:, :2] = -9.0  # prompt features are never labels (f_{j+k} with j >= 1)
    ids2[1, 8:] = 1
    loss2, m2 = falcon_loss(pred2, f2, lm, None, ids2, mask, k)
    torch.testing.assert_close(loss2, loss)
    per, _ = falcon_loss(pred, f, lm, None, ids, mask, k, per_sequence=True)
    one, _ = falcon_loss(pred[1:, :8], f[1:, :8], lm, None, ids[1:, :8], mask[1:, :8], k)
    torch.testing.assert_close(per[1], one)


def test_add_feature_noise():
    x = torch.zeros(4, 5, 6)
    a = add_feature_noise(x, 0.1, generator=torch.Generator().manual_seed(1))
    b = add_feature_noise(x, 0.1, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.abs().max() <= 0.1 and a.abs().max() > 0.05
    assert x.abs().sum() == 0  # not in place
    n = add_feature_noise(x, 0.5, kind="normal", generator=torch.Generator().manual_seed(1))
    assert 0.4 < n.std().item() < 0.6
    assert add_feature_noise(x, 0.0) is x


def test_frozen_target_gets_no_gradient():
    from drafters.losses import csgd_step
    from drafters.models import FalconConfig, FalconDrafter

    target = tiny_target(hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64)
    ids = torch.randint(3, 200, (2, 10))
    attn = torch.ones(2, 10, dtype=torch.long)
    attn[1, 8:] = 0
    loss_mask = attn.clone()
    loss_mask[:, :3] = 0
    f, logits = target.features(ids, attn, return_logits=True)
    assert not f.requires_grad
    d, vocab = target.hidden_size, target.vocab_size

    heads = MedusaHeads(MedusaConfig(d, vocab))
    loss, _ = heads_loss(heads(f, target.lm_head), ids, loss_mask)
    loss.backward()
    falcon = FalconDrafter(FalconConfig.from_target_config(target.config, intermediate_size=48))
    for tf in (True, False):
        loss, _ = csgd_step(
            falcon,
            f,
            ids,
            attn,
            loss_mask,
            target.embed_tokens,
            target.lm_head,
            2,
            0.5,
            teacher_forcing_only=tf,
            target_logits=logits,
            noise=0.1,
        )
        loss.backward()
    assert all(p.grad is None for p in target.model.parameters())
    assert all(p.grad is not None for p in heads.parameters())
    assert all(p.grad is not None for p in falcon.parameters())
    assert all(vocab not in p.shape for p in falcon.state_dict().values())
