import math

import pytest
import torch
from torch import nn

from drafters.losses import choose_glance, csgd_lambda, csgd_step, falcon_loss, pass2_inputs
from drafters.losses.falcon import falcon_valid
from drafters.losses.labels import shift_left
from drafters.losses.own_blocks import depth_accuracy, depth_counts, own_block_bias
from drafters.models import FalconConfig, FalconDrafter

D, V = 16, 24


def test_lambda_schedule():
    assert csgd_lambda(0.0) == 0.4 and csgd_lambda(1.0) == 0.0
    assert math.isclose(csgd_lambda(0.25), 0.3)
    assert csgd_lambda(-1) == 0.4 and csgd_lambda(2) == 0.0
    assert math.isclose(csgd_lambda(0.5, start=0.45, end=0.1), 0.275)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_choose_glance_counts_runs_and_determinism(k):
    B, T = 6, 30
    g = torch.Generator().manual_seed(k)
    cand = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):  # one or two candidate spans per row
        s = int(torch.randint(0, 8, (1,), generator=g))
        e = int(torch.randint(s + 2, T, (1,), generator=g))
        cand[b, s:e] = True
        if b % 2:
            cand[b, e + 2 : e + 7] = True
    n = torch.tensor([0, 1, 3, 4, 7, 100])
    pos = torch.arange(T).expand(B, T)
    glanced = choose_glance(cand, n, pos, k, torch.Generator().manual_seed(0))
    again = choose_glance(cand, n, pos, k, torch.Generator().manual_seed(0))
    assert torch.equal(glanced, again)
    assert not (glanced & ~cand).any()
    assert torch.equal(glanced.sum(-1), torch.minimum(n, cand.sum(-1)))
    for b in range(B):
        partial = 0
        for start in range(0, T, k):  # each block: glanced positions are a tail of its candidates
            c = cand[b, start : start + k].tolist()
            gl = glanced[b, start : start + k].tolist()
            idx = [i for i, x in enumerate(c) if x]
            chosen = [i for i, x in enumerate(gl) if x]
            assert chosen == idx[len(idx) - len(chosen) :], (b, start)
            partial += 0 < len(chosen) < len(idx)
        assert partial <= 1  # only the last block taken may be partial


def _pass2_case(lam, k=2):
    B, T = 2, 14
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, T), generator=g)
    loss_mask = torch.zeros(B, T)
    loss_mask[0, 3:] = 1
    loss_mask[1, 4:11] = 1  # row 1 padded from 11 on
    feats = torch.randn(B, T, D, generator=g)
    pred1 = torch.randn(B, T, D, generator=g)
    tok1 = shift_left(ids, k + 1).clone()  # all right ...
    wrong = [(0, 2), (0, 3), (0, 4), (0, 7), (1, 3)]  # ... except these outputs j
    for b, j in wrong:
        tok1[b, j] = (tok1[b, j] + 1) % V
    nxt = shift_left(ids, 1)
    pos = torch.arange(T).expand(B, T)
    out = pass2_inputs(
        pred1, tok1, feats, nxt, ids, loss_mask, pos, k, lam, torch.Generator().manual_seed(3)
    )
    return out, dict(ids=ids, loss_mask=loss_mask, feats=feats, pred1=pred1, tok1=tok1, nxt=nxt)


@pytest.mark.parametrize("lam", [0.0, 0.4, 0.5, 1.0])
def test_pass2_inputs_hamming_glance_count_and_coupling(lam):
    k = 2
    out, c = _pass2_case(lam, k)
    # valid j (k = 2): loss_mask[j+2] and loss_mask[j+3]. Row 0: j = 1..10, so all four wrong
    # outputs count; row 1: j = 2..7, so (1, 3) counts.
    assert out.hamming.tolist() == [4, 1]
    assert out.n_glance.tolist() == [math.floor(lam * 4 + 0.5), math.floor(lam * 1 + 0.5)]
    assert torch.equal(out.glanced.sum(-1), out.n_glance)
    cand = torch.zeros_like(out.own)
    cand[0, 3:13] = True  # m = j + k for valid j
    cand[1, 4:10] = True
    assert torch.equal(out.own | out.glanced, cand) and not (out.own & out.glanced).any()
    for b in range(2):
        for m in range(14):
            own_f = torch.equal(out.features[b, m], c["pred1"][b, m - k]) if m >= k else False
            true_f = torch.equal(out.features[b, m], c["feats"][b, m])
            if out.own[b, m]:  # coupled: own feature and own token from the same output m - k
                assert own_f and out.next_tokens[b, m] == c["tok1"][b, m - k]
            else:  # glanced or never own: the true pair
                assert true_f and out.next_tokens[b, m] == c["nxt"][b, m]


def _drafter(seed=0, k=2, fusion="linear"):
    torch.manual_seed(seed)
    cfg = FalconConfig(
        D, V, k=k, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, fusion=fusion
    )
    return FalconDrafter(cfg)


def _batch(lengths, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    B = len(lengths)
    lm = nn.Linear(D, V, bias=False).requires_grad_(False)
    embed = nn.Embedding(V, D).requires_grad_(False)
    f = torch.randn(B, T, D, generator=g)
    ids = torch.randint(0, V, (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        attn[b, :n] = 1
        loss_mask[b, 3:n] = 1
    return dict(
        features=f, input_ids=ids, attention_mask=attn, loss_mask=loss_mask, embed=embed, lm_head=lm
    )


@pytest.mark.parametrize(
    "tf, fusion, variant",
    [(True, "linear", "decode"), (True, "lstm", "decode"), (False, "linear", "decode")]
    + [(False, "linear", "paper"), (False, "lstm", "paper"), (False, "eagle3", "decode")],
)
def test_batch_of_1_equals_batch_of_4_per_sequence(tf, fusion, variant):
    lengths, T = [13, 8, 16, 6], 16
    drafter, b4 = _drafter(fusion=fusion), _batch(lengths, T)
    kw = dict(k=2, lam=0.0, teacher_forcing_only=tf, per_sequence=True, variant=variant)
    batch, _ = csgd_step(drafter, **b4, **kw)
    for b, n in enumerate(lengths):
        one = {
            key: (v[b : b + 1, :n] if key not in ("embed", "lm_head") else v)
            for key, v in b4.items()
        }
        loss, _ = csgd_step(drafter, **one, **kw)
        torch.testing.assert_close(batch[b : b + 1], loss)


@pytest.mark.parametrize("tf, variant", [(True, "decode"), (False, "decode"), (False, "paper")])
def test_padding_never_leaks_into_loss_or_glancing(tf, variant):
    lengths, T = [16, 9], 16
    drafter, b = _drafter(), _batch(lengths, T)
    kw = dict(k=2, lam=0.5, teacher_forcing_only=tf, noise=0.1, variant=variant)
    loss, m = csgd_step(drafter, **b, **kw, generator=torch.Generator().manual_seed(0))
    b["features"][1, 9:] = 50.0
    b["input_ids"][1, 9:] = 5
    loss2, m2 = csgd_step(drafter, **b, **kw, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(loss2, loss)
    assert all(torch.equal(m[key], m2[key]) for key in m)


class Spy(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, []

    def forward(self, *args):
        out = self.inner(*args)
        self.calls.append((args, out))
        return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("loss_on_glanced", [True, False])
def test_paper_variant_wiring(loss_on_glanced, k):
    lam = 0.6
    spy, b = Spy(_drafter(k=k)), _batch([16, 12], 16)
    loss, m = csgd_step(
        spy,
        **b,
        k=k,
        lam=lam,
        variant="paper",
        loss_on_glanced=loss_on_glanced,
        generator=torch.Generator().manual_seed(0),
    )
    (args1, pred1), (args2, pred2) = spy.calls
    assert not pred1.requires_grad and pred2.requires_grad  # pass 1 without gradient
    ids, lm = b["input_ids"], b["lm_head"]
    assert torch.equal(args1[0], b["features"]) and torch.equal(args1[1], shift_left(ids, 1))
    tok1 = lm(pred1).argmax(-1)
    pos = args1[4]
    gen = torch.Generator().manual_seed(0)
    want = pass2_inputs(pred1, tok1, b["features"], args1[1], ids, b["loss_mask"], pos, k, lam, gen)
    assert torch.equal(args2[0], want.features) and torch.equal(args2[1], want.next_tokens)
    assert want.n_glance.sum() > 0
    assert math.isclose(m["glance_ratio"].item(), want.n_glance.sum() / want.hamming.sum())
    assert math.isclose(m["hamming"].item(), want.hamming.float().mean().item())
    include = None if loss_on_glanced else ~want.glanced
    ref, _ = falcon_loss(pred2, b["features"], lm, None, ids, b["loss_mask"], k, include=include)
    torch.testing.assert_close(loss, ref)
    assert {"acc", "acc_pass2", "hamming", "hamming_rate"} <= set(m)
    assert {f"acc_pass2_pos{p}" for p in range(1, k + 1)} <= set(m)
    assert {f"acc_pos{p}" for p in range(1, k + 1)} <= set(m)


def test_teacher_forcing_only_is_falcon_loss_on_true_inputs():
    k = 3
    drafter, b = _drafter(k=k), _batch([16, 11], 16)
    loss, m = csgd_step(drafter, **b, k=k, lam=0.4, teacher_forcing_only=True)
    pred = drafter(b["features"], shift_left(b["input_ids"], 1), b["embed"], b["attention_mask"])
    ref, rm = falcon_loss(
        pred, b["features"], b["lm_head"], None, b["input_ids"], b["loss_mask"], k
    )
    torch.testing.assert_close(loss, ref)
    assert m["glance_ratio"].item() == 0.0 and "acc_pos3" in m


def test_own_block_bias_patterns():
    """k = 2, T = 6, no padding: the patterns of own_blocks.py's docstring, and copy 3."""
    pos = torch.arange(6).view(1, 6)
    b2 = own_block_bias(pos, None, 2, 2)[0, 0].int()
    true_part = [[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2
    own_part = [[0, 0, 1, 1, 0, 0]] * 2 + [[0, 0, 0, 0, 1, 1]] * 2
    assert b2[2:, :6].tolist() == true_part and b2[2:, 6:].tolist() == own_part
    assert b2[:2, :6].sum() == 0 and b2[:2, 6:].tolist() == [[1, 1, 0, 0, 0, 0]] * 2
    b3 = own_block_bias(pos, None, 2, 3)[0, 0].int()  # chain root = own block - 1
    row4 = b3[4].tolist()  # block 2 of copy 3: root block 1
    assert row4[:6] == [1, 1, 0, 0, 0, 0]  # true keys before the root block
    assert row4[6:12] == [0, 0, 1, 1, 0, 0] and row4[12:] == [0, 0, 0, 0, 1, 1]
    attn = torch.ones(1, 6, dtype=torch.long)
    attn[0, :2] = 0  # left padding hides keys; the diagonal stays open
    padded = own_block_bias(pos, attn, 2, 2)[0, 0]
    assert not padded[:, :2].any() and padded[0, 6] and padded[1, 7]


@pytest.mark.parametrize("k", [2, 3])
def test_decode_variant_equals_a_forward_per_block(k):
    """Pass 2 of the decode variant, at lam = 0, is for every block beta the drafter's plain
    forward over [true pairs of blocks < beta ; own pairs of block beta]; the loss is the
    teacher-forced loss plus pass 2's over its candidates."""
    T = 5 * k + 1
    drafter, b = _drafter(k=k), _batch([T, T - k - 1], T)
    drafter.eval()
    loss, m = csgd_step(drafter, **b, k=k, lam=0.0, variant="decode")
    ids, f, lm, embed, attn = (b[x] for x in ("input_ids", "features", "lm_head", "embed",
                                              "attention_mask"))  # fmt: skip
    nxt = shift_left(ids, 1)
    pred1 = drafter(f, nxt, embed, attn)
    tok1 = lm(pred1).argmax(-1)
    valid = falcon_valid(b["loss_mask"], k)
    cand = torch.zeros_like(valid)
    cand[:, k:] = valid[:, :-k]
    pred2 = torch.zeros_like(pred1)
    for row in range(2):
        for beta in range(1, T // k + 1):
            s, e = beta * k, min(beta * k + k, T)
            own_f = torch.where(cand[row, s:e, None], pred1[row, s - k : e - k], f[row, s:e])
            own_t = torch.where(cand[row, s:e], tok1[row, s - k : e - k], nxt[row, s:e])
            x = torch.cat([f[row, :s], own_f])[None]
            t = torch.cat([nxt[row, :s], own_t])[None]
            pred2[row, s:e] = drafter(x, t, embed)[0, s:]
    tf, _ = falcon_loss(pred1, f, lm, None, ids, b["loss_mask"], k)
    p2, _ = falcon_loss(pred2, f, lm, None, ids, b["loss_mask"], k, include=cand)
    torch.testing.assert_close(loss, tf + p2, atol=1e-5, rtol=1e-5)
    assert {f"acc_depth{d}" for d in range(1, 2 * k + 1)} <= set(m)
    assert {f"acc_pass2_pos{p}" for p in range(1, k + 1)} <= set(m)


def test_depth_counts_equal_a_loop_over_roots():
    k, B, T, P = 2, 3, 17, 3
    g = torch.Generator().manual_seed(0)
    ranks = [torch.randint(0, 3, (B, T), generator=g) * (torch.rand(B, T, generator=g) < 0.5)
             for _ in range(P)]  # fmt: skip
    defined = [torch.rand(B, T, generator=g) < 0.9 for _ in range(P)]
    pos = torch.arange(T).expand(B, T)
    counts, totals = depth_counts(ranks, defined, pos, k, topk=3)
    want_c, want_t = torch.zeros(P * k, 3, dtype=torch.long), torch.zeros(P * k, dtype=torch.long)
    for b in range(B):
        for N in range(0, T, k):
            for d in range(1, P * k + 1):
                chain = [(c, N - k + e - 1) for e in range(1, d + 1) for c in [(e - 1) // k]]
                if any(j < 0 or j >= T or not defined[c][b, j] for c, j in chain):
                    break
                if any(ranks[c][b, j] != 0 for c, j in chain[:-1]):
                    break
                want_t[d - 1] += 1
                c, j = chain[-1]
                want_c[d - 1, ranks[c][b, j]] += 1
    assert torch.equal(totals, want_t) and torch.equal(counts, want_c)
    acc = depth_accuracy(counts, totals)
    assert math.isclose(acc["acc_depth1"].item(), (want_c[0, 0] / want_t[0]).item(), rel_tol=1e-6)


def test_decode_variant_deeper_passes_and_refusals():
    k = 2
    drafter, b = _drafter(k=k), _batch([16, 12], 16)
    loss, m = csgd_step(drafter, **b, k=k, lam=0.4, variant="decode", passes=3,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss) and drafter.fusion.weight.grad.abs().sum() > 0
    assert {f"acc_depth{d}" for d in range(1, 7)} <= set(m) and "loss_pass3" in m
    with pytest.raises(ValueError, match="fusion=linear"):
        csgd_step(_drafter(fusion="lstm"), **b, k=k, lam=0.0, variant="decode")
    with pytest.raises(ValueError, match="csgd.variant"):
        csgd_step(drafter, **b, k=k, lam=0.0, variant="glat")


def test_falcon_chain_rates_extend_the_last_measured_pass():
    from drafters.training.module import FALCON_DECODE_PASSES, accept_len_estimate
    from drafters.training.module import falcon_chain_rates as rates

    m = {f"val/acc_depth{d}": 1.0 - 0.1 * d for d in range(1, 5)}  # k = 2, passes = 2
    acc = rates(m, 2, 2)
    assert len(acc) == 2 * FALCON_DECODE_PASSES and acc[:4] == [0.9, 0.8, 0.7, 0.6]
    assert acc[4:] == [0.7, 0.6] * (FALCON_DECODE_PASSES - 2)
    lstm = {"val/acc_pos1": 0.9, "val/acc_pos2": 0.8, "val/acc_pass2_pos1": 0.5}
    assert rates(lstm, 2, 2)[:4] == [0.9, 0.8, 0.5, 0.0]
    assert accept_len_estimate(rates(m, 2, 2)) > accept_len_estimate(rates(lstm, 2, 2))


def test_decode_variant_loss_does_not_depend_on_logging_the_metrics():
    drafter, b = _drafter(k=2), _batch([16, 12], 16)
    kw = dict(k=2, lam=0.4, variant="decode", passes=3)
    on, m_on = csgd_step(drafter, **b, **kw, generator=torch.Generator().manual_seed(0))
    off, m_off = csgd_step(drafter, **b, **kw, accuracy=False,
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
    torch.testing.assert_close(on, off)
    assert "acc_depth6" in m_on and not any(k.startswith("acc") for k in m_off)


def test_own_pass_weight_scales_the_own_block_losses():
    """decode loss = teacher-forced loss + w * own-block losses; w = 0 is teacher forcing's."""
    k = 2
    drafter, b = _drafter(k=k), _batch([16, 12], 16)
    tf, _ = csgd_step(drafter, **b, k=k, lam=0.4, teacher_forcing_only=True)
    kw = dict(k=k, lam=0.4, variant="decode", passes=3)
    full, m = csgd_step(drafter, **b, **kw, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(full, tf + m["loss_pass2"] + m["loss_pass3"])
    half, m = csgd_step(drafter, **b, **kw, own_pass_weight=0.5,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    torch.testing.assert_close(half, tf + 0.5 * (m["loss_pass2"] + m["loss_pass3"]))
    zero, m = csgd_step(drafter, **b, **kw, own_pass_weight=0.0,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    torch.testing.assert_close(zero, tf)
    assert "acc_depth6" in m  # the own-block passes are still measured
