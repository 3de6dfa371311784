"""The draft vocabulary: construction, the sliced head and id maps, the losses over it, and
lossless decoding through it on every decoder path, with tokens outside it in the output."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from test_decoding_ar import make_target, reference
from test_decoding_falcon import PROMPTS, ScriptedFalcon
from test_decoding_heads import K, OracleHeads
from torch import nn

from drafters.decoding import decode_falcon, decode_heads
from drafters.losses import falcon_loss, heads_loss
from drafters.models import CerberusConfig, CerberusHeads, FalconConfig, MedusaConfig, MedusaHeads
from drafters.models.vocab import DraftVocab, coverage, token_counts, top_ids


def test_top_ids_by_count_then_id_and_coverage():
    counts = token_counts([[5, 5, 2, 7], [7, 5, 0]], vocab_size=10)
    assert counts.tolist() == [1, 0, 1, 0, 0, 3, 0, 2, 0, 0]
    assert top_ids(counts, 3).tolist() == [5, 7, 0]  # 0 and 2 tie at 1: the smaller id first
    assert top_ids(counts, 6).tolist() == [5, 7, 0, 2, 1, 3]  # unseen ids fill in id order
    assert coverage(counts, top_ids(counts, 2)) == pytest.approx(5 / 7)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_counts([[3, 10]], vocab_size=10)
    with pytest.raises(ValueError, match="must be in 1..10"):
        top_ids(counts, 11)


def test_vocab_maps_and_sliced_head():
    torch.manual_seed(0)
    lm = nn.Linear(8, 20, bias=False)
    v = DraftVocab(20, 5)
    v.set_ids(torch.tensor([7, 3, 19, 0, 11]))
    head = v.head(lm)
    assert head.weight.shape == (5, 8) and not head.weight.requires_grad
    x = torch.randn(4, 8)
    torch.testing.assert_close(head(x), lm(x)[:, v.ids], rtol=0, atol=1e-6)
    assert v.head(lm) is head  # sliced once
    assert v.to_target(torch.tensor([[0, 4]])).tolist() == [[7, 11]]
    assert v.to_draft(torch.tensor([7, 8, 11, 0])).tolist() == [0, -1, 4, 3]
    v.set_ids(torch.tensor([1, 2, 3, 4, 5]))  # new ids: new head, new maps
    assert v.head(lm) is not head and v.to_draft(torch.tensor([7])).item() == -1
    for bad in ([1, 1, 2, 3, 4], [1, 2, 3, 4, 20], [1, 2, 3]):
        with pytest.raises(ValueError):
            v.set_ids(torch.tensor(bad))
    with pytest.raises(ValueError, match="draft_vocab_size=21"):
        DraftVocab(20, 21)


def test_vocab_ids_travel_in_the_state_dict():
    a = MedusaHeads(MedusaConfig(8, 20, num_heads=2, draft_vocab_size=4))
    a.vocab.set_ids(torch.tensor([9, 1, 4, 2]))
    b = MedusaHeads(MedusaConfig(8, 20, num_heads=2, draft_vocab_size=4))
    b.load_state_dict(a.state_dict())
    assert b.vocab.ids.tolist() == [9, 1, 4, 2] and "vocab.ids" in a.state_dict()
    assert b.vocab.to_draft(torch.tensor([4])).item() == 2  # maps rebuilt after loading
    own = CerberusHeads(CerberusConfig(8, 20, num_heads=2, trainable_lm_head=True,
                                       draft_vocab_size=4))  # fmt: skip
    own.vocab.set_ids(torch.tensor([9, 1, 4, 2]))
    w = torch.randn(20, 8)
    own.load_lm_head(w)
    torch.testing.assert_close(own.lm_head.weight, w[[9, 1, 4, 2]])
    assert own.cfg.num_params() == CerberusConfig(8, 20, num_heads=2).num_params() + 4 * 8


def _vocab(ids, V):
    v = DraftVocab(V, len(ids))
    v.set_ids(torch.tensor(ids))
    return v


def test_heads_loss_over_a_vocab_is_the_restricted_ce_and_counts_the_rest():
    V, B, T, Kh = 12, 2, 9, 2
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    vocab = _vocab([0, 2, 3, 5, 7, 8, 11], V)
    logits = torch.randn(B, T, Kh, len(vocab.ids), generator=g)
    loss, m = heads_loss(logits, ids, mask, decay=1.0, vocab=vocab)
    # by hand: per head, CE over the labels in the vocab (mapped to draft indices)
    want, oov, total = 0.0, 0, 0
    for i in range(Kh):
        ces, hits, n = [], 0, 0
        for b in range(B):
            for t in range(T - 2 - i):
                label = int(ids[b, t + 2 + i])
                n += 1
                col = vocab.to_draft(torch.tensor(label)).item()
                if col < 0:
                    oov += 1
                    continue
                row = logits[b, t, i]
                ces.append(F.cross_entropy(row[None], torch.tensor([col])))
                hits += int(row.argmax() == col)
        want += torch.stack(ces).mean()
        total += n
        assert m[f"acc_head{i}"].item() == pytest.approx(hits / n)  # unknown labels are misses
    torch.testing.assert_close(loss, want)
    assert oov > 0 and m["oov_rate"].item() == pytest.approx(oov / total)


def test_heads_loss_projects_only_labelled_rows():
    V, d, B, T, Kh = 12, 6, 2, 8, 3
    torch.manual_seed(0)
    hidden = torch.randn(B, T, Kh, d, requires_grad=True)
    lm = nn.Linear(d, V, bias=False)
    ids = torch.randint(0, V, (B, T))
    mask = torch.ones(B, T)
    mask[1, 5:] = 0
    full, m_full = heads_loss(lm(hidden), ids, mask)
    rows, m_rows = heads_loss(hidden, ids, mask, head=lm)
    torch.testing.assert_close(rows, full)
    assert m_rows.keys() == m_full.keys()
    _, quiet = heads_loss(hidden, ids, mask, head=lm, accuracy=False)
    assert not [k for k in quiet if k.startswith("acc")]


def test_falcon_kl_is_against_the_restricted_renormalised_target():
    V, d, B, T, k = 10, 6, 1, 8, 2
    torch.manual_seed(0)
    lm = nn.Linear(d, V, bias=False).requires_grad_(False)
    f, pred = torch.randn(B, T, d), torch.randn(B, T, d)
    ids = torch.randint(0, V, (B, T))
    mask = torch.ones(B, T)
    vocab = _vocab([1, 4, 6, 9], V)
    target_logits = lm(f) * 1.7  # any full-vocabulary logits
    _, m = falcon_loss(pred, f, vocab.head(lm), target_logits, ids, mask, k, vocab=vocab)
    j = torch.arange(T - k - 1)
    p_t = F.softmax(target_logits[0, j + k][:, vocab.ids], -1)  # restricted, renormalised
    logq = F.log_softmax(lm(pred[0, j])[:, vocab.ids], -1)
    kl = (p_t * (p_t.log() - logq)).sum(-1).mean()
    torch.testing.assert_close(m["loss_kl"], kl)
    tok = vocab.to_draft(ids[0, j + k + 1])
    assert m["oov_rate"].item() == pytest.approx(float((tok < 0).float().mean()))


# ---- decoding through a draft vocabulary ----------------------------------------------------


class VocabOracle(nn.Module):
    """OracleHeads (every head's top-1 is the true token) whose logits keep only the columns of
    a draft vocabulary: a true token outside it can never be drafted."""

    def __init__(self, oracle: OracleHeads, ids: list[int], vocab_size: int):
        super().__init__()
        self.oracle = oracle
        self.vocab = _vocab(ids, vocab_size)

    def forward(self, features, lm_head):
        return self.oracle(features, lm_head)[..., self.vocab.ids]


def _continuation(kind, prompt, n):
    ids, ref = reference(kind, prompt, n)
    return ids, ref, ref[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("kind, prompt", [("seed0", PROMPTS[0]), ("tied", PROMPTS[1])])
def test_head_decoding_through_a_vocab_is_lossless_and_never_drafts_outside_it(kind, prompt):
    n = 40
    target = make_target(kind)
    ids, ref, out = _continuation(kind, prompt, n)
    seq = ref[0]
    left_out = out[3]  # a drafted (not bonus) token of the first step, now never proposed
    inside = sorted(set(out) - {left_out})
    others = [t for t in range(target.vocab_size) if t not in set(out)][:7]  # decoys
    oracle = OracleHeads(target, seq, [0] * K)
    full = decode_heads(target, oracle, "chain4", ids, n)
    res = decode_heads(target, VocabOracle(oracle, inside + others, target.vocab_size),
                       "chain4", ids, n)  # fmt: skip
    assert torch.equal(full.sequences, ref) and torch.equal(res.sequences, ref)
    assert left_out in res.sequences[0, ids.shape[1] :].tolist()
    assert res.tree_steps > full.tree_steps  # the left-out token cut some step short
    # every drafted token is in the vocabulary: with all of the output in it, nothing changes
    every = VocabOracle(oracle, sorted(set(out)) + others, target.vocab_size)
    assert decode_heads(target, every, "chain4", ids, n).accept_lens == full.accept_lens
    # the gated path and a bushier tree go through the same mapping
    for tree in ("mc_sim_7b_63_first16",):
        gated = decode_heads(target, VocabOracle(oracle, inside + others, target.vocab_size),
                             tree, ids, n, threshold_override=float("-inf"))  # fmt: skip
        assert torch.equal(gated.sequences, ref)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_falcon_decoding_through_a_vocab(k):
    n, kind, prompt = 1 + 4 * (4 * k + 1), "seed0", PROMPTS[0]
    target = make_target(kind)
    ids, ref, out = _continuation(kind, prompt, n)
    cfg = FalconConfig.from_target_config(target.config, k=k, draft_vocab_size=len(set(out)) + 5)
    drafter = ScriptedFalcon(cfg, ref[0], target, "right")
    extra = [t for t in range(target.vocab_size) if t not in set(out)][:5]
    drafter.vocab.set_ids(torch.tensor(sorted(set(out)) + extra))
    res = decode_falcon(target, drafter, ids, n, tree="chain")
    assert torch.equal(res.sequences, ref)
    assert res.accept_lens == [4 * k] * 4  # ids mapped back right: every drafted token accepted

    left_out = out[3]  # drafted in the first step (not a bonus token)
    cfg_small = dataclasses.replace(cfg, draft_vocab_size=cfg.draft_vocab_size - 1)
    small = ScriptedFalcon(cfg_small, ref[0], target, "right")
    small.vocab.set_ids(torch.tensor(sorted(set(out) - {left_out}) + extra))
    res = decode_falcon(target, small, ids, n, tree="kmask2_8layer_tree" if k == 2 else "chain")
    assert torch.equal(res.sequences, ref)
    assert res.tree_steps > 4  # the left-out token cut some step short


def test_trained_drafters_carry_their_vocab_through_export(tiny, tiny_checkpoints, tiny_exported):
    from drafters.export import load_drafter

    for kind, ckpt in tiny_checkpoints.items():
        state = torch.load(ckpt, weights_only=True)["state_dict"]
        ids = state["drafter.vocab.ids"]
        info = json.loads((ckpt.parent.parent / "draft_vocab.json").read_text())
        assert ids.numel() == info["size"] == 64 and ids.unique().numel() == 64
        assert 0 < info["coverage_validation"] <= info["coverage_train"] <= 1
        d = load_drafter(tiny_exported[kind], tiny)
        assert torch.equal(d.model.vocab.ids, ids) and d.model.vocab.ids.dtype == torch.long
        cfg = json.loads((tiny_exported[kind] / "config.json").read_text())
        assert cfg["model"]["draft_vocab_size"] == 64
        assert cfg["weights"]["tensors"]["drafter.vocab.ids"] == [64]


@pytest.mark.parametrize("kind", ["medusa", "cerberus", "falcon"])
def test_exported_drafter_output_holds_tokens_outside_its_vocab(kind, tiny, tiny_exported):
    """The lossless tests of test_export.py run these drafters; here: their greedy output does
    contain tokens they can never draft, and decoding still equals plain greedy."""
    from test_decoding_ar import greedy

    from drafters.data.chat import render_prompt
    from drafters.export import load_drafter
    from drafters.speculate import speculative_decode

    d = load_drafter(tiny_exported[kind], tiny)
    ids = torch.tensor([render_prompt(tiny.tokenizer, [{"role": "user", "content": "Hi there"}])])
    ref = greedy(tiny, ids, 48)
    out = set(ref[0, ids.shape[1] :].tolist())
    assert out - set(d.model.vocab.ids.tolist())  # some output tokens are outside the vocab
    assert torch.equal(speculative_decode(tiny, d, ids, 48, gate="none").sequences, ref)
