"""Dynamic trees (decoding/dynamic.py): candidate trees merged from a drafter and n-gram lookup,
cut to the nodes worth verifying on a cost profile, calibrated online; and the output equals HF
greedy on every path (head drafters, Falcon, n-gram only; chosen and fixed budgets)."""

import pytest
import torch
from test_decoding_ar import make_target, reference
from test_decoding_falcon import falcon
from test_decoding_heads import RandomHeads, oracle

from drafters.decoding.candidates import Calibration, CandidateTree, choose_budget
from drafters.decoding.dynamic import DynamicConfig, decode_dynamic
from drafters.decoding.ngram import NgramIndex

PROMPTS = ["The quick brown fox", "Hello, how are you?"]
CHEAP = [1.0 + 0.02 * n for n in range(33)]  # trees nearly free: verify whatever scores
DEAR = [1.0] + [3.0 + n for n in range(32)]  # a tree step costs 3+ AR steps: only sure bets


def test_candidates_merge_score_and_cut():
    tree = CandidateTree(root=7, calib=Calibration())
    a = tree.add(0, 5, 0.6, "x")
    b = tree.add(a, 6, 0.5, "x")
    assert tree.add(0, 5, 0.9, "y") == a  # the same token below the same parent: one node
    assert tree.nodes[a].score == 0.9 and tree.nodes[a].cond == {"x": 0.6, "y": 0.9}
    assert tree.nodes[b].score == pytest.approx(0.3)  # scored below the parent it had then
    c = tree.add(b, 8, 0.5, "y")
    assert tree.nodes[c].score == pytest.approx(0.15)  # parent score x conditional
    d = tree.add(0, 4, 0.5, "x")
    assert tree.best(2) == [a, d] and tree.best(3) == [a, b, d] and tree.best(9) == [a, b, c, d]
    assert tree.scores_sorted() == pytest.approx([0.9, 0.5, 0.3, 0.15])
    tokens, layout, rows = tree.layout([a, b, d], "cpu")
    assert tokens.tolist() == [7, 5, 6, 4] and rows == [0, a, b, d]
    assert layout.parents.tolist() == [-1, 0, 1, 0] and layout.depth.tolist() == [0, 1, 2, 1]
    path = tree.add_path([5, 6, 9], [0.8, 0.5, 0.2], "ngram2")
    assert path[:2] == [a, b] and len(tree) == 5


def test_calibration_scales_a_source_by_what_verification_accepted():
    calib = Calibration(prior=2.0)
    tree = CandidateTree(root=0, calib=calib)
    nodes = [tree.add(0, t, 0.8, "x") for t in range(10)]
    calib.update(tree, nodes, accepted={0})  # promised 8 tokens at depth 1, got none
    assert calib.evidence("x", 1) == 10 and calib.evidence("x", 2) == 0
    assert calib.factor("x", 1) == pytest.approx(1.6 / 9.6)  # w = 2 nodes of 0.8
    assert calib.factor("x", 2) == calib.factor("x", 1)  # unseen depth: the depth above's
    assert calib.factor("y", 1) == 1.0 and calib.factor("y", 3) == 1.0
    # tiny raw numbers that are always right are trusted after a few verifications
    shy = CandidateTree(root=0, calib=calib)
    few = [shy.add(0, t, 0.02, "s") for t in range(4)]
    calib.update(shy, few, accepted=set(few) | {0})
    assert calib.score("s", 1, 0.02) == pytest.approx(0.02 * 4.04 / 0.12)  # w = 0.04
    # a child of a rejected parent says nothing about its own conditional
    deep = CandidateTree(root=0, calib=calib)
    p = deep.add(0, 1, 0.5, "d")
    q = deep.add(p, 2, 0.5, "d")
    calib.update(deep, [p, q], accepted={0})
    assert calib.evidence("d", 1) == 1 and calib.evidence("d", 2) == 0
    assert calib.score("z", 1, 0.9) == 0.9 and Calibration(prior=1.0).score("z", 1, 5.0) == 1.0


def test_budget_maximises_expected_tokens_per_unit_of_time():
    assert choose_budget([0.9, 0.8, 0.1], CHEAP) == 3
    assert choose_budget([0.9, 0.8, 0.1], DEAR) == 0  # 1.9 tokens for 4 units: not worth it
    assert choose_budget([0.95, 0.9, 0.9], [1.0, 1.3, 1.35, 2.5]) == 2  # 3 rows cheap, 4 dear
    assert choose_budget([0.2], [1.0, 1.33]) == 0 and choose_budget([0.4], [1.0, 1.33]) == 1
    assert choose_budget([0.9] * 9, CHEAP, max_nodes=4) == 4
    assert choose_budget([], CHEAP) == 0


def test_ngram_lookup_takes_the_latest_earlier_occurrence_of_the_longest_suffix():
    idx = NgramIndex(max_n=3)
    idx.extend([1, 2, 3, 9, 1, 2])
    assert idx.lookup(3) == ([3, 9, 1], 2)  # "1 2" occurred before, "9 1 2" did not
    idx.extend([7, 1, 2])
    assert idx.lookup(2) == ([7, 1], 2)  # the latest earlier "1 2" (not the first)
    idx.extend([5])
    assert idx.lookup(4) == ([], 0)
    idx.extend([5, 5])
    assert idx.lookup(4) == ([5], 2)  # overlapping: "5 5" ended one token earlier
    with pytest.raises(ValueError, match="max_n"):
        NgramIndex(0)


def _check(target, drafter, kind, prompt, n, cfg, cost):
    ids, ref = reference(kind, prompt, n)
    res = decode_dynamic(target, drafter, ids, n, cfg, cost=cost)
    assert torch.equal(res.sequences, ref), (kind, prompt, n, cfg)
    assert len(res.step_nodes) == res.verify_forwards
    assert all(0 <= s <= cfg.max_nodes for s in res.step_nodes)
    assert res.tree_steps == sum(s > 0 for s in res.step_nodes)
    return res


CONFIGS = [
    DynamicConfig(),
    DynamicConfig(ngram=0, width=2, max_nodes=6),
    DynamicConfig(budget=0),
    DynamicConfig(budget=1, ngram=0),
    DynamicConfig(budget=16, width=6),
]


@pytest.mark.parametrize("cost", [CHEAP, DEAR], ids=["cheap", "dear"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_head_drafters_are_lossless(cfg, cost):
    for kind, prompt in [("seed0", PROMPTS[0]), ("tied", PROMPTS[1])]:
        target = make_target(kind)
        drafters = [RandomHeads(target.hidden_size, seed=1), oracle(kind, prompt, [0, 1, None, 0])]
        for drafter in drafters:
            for n in (1, 2, 37):
                _check(target, drafter, kind, prompt, n, cfg, cost)


@pytest.mark.parametrize("k, fusion", [(1, "linear"), (2, "linear"), (2, "lstm"), (3, "linear")])
@pytest.mark.parametrize("cfg", CONFIGS[:2] + CONFIGS[4:] + [DynamicConfig(min_anchor=0.0)],
                         ids=str)  # fmt: skip
def test_falcon_is_lossless(k, fusion, cfg):
    for kind, prompt in [("seed0", PROMPTS[0]), ("tied", PROMPTS[1])]:
        target = make_target(kind)
        for mode in ("random", "mixed"):
            drafter = falcon(target, k, fusion, kind, prompt, mode=mode, seed=len(prompt))
            for n in (2, 37):
                _check(target, drafter, kind, prompt, n, cfg, CHEAP)


@pytest.mark.parametrize("k", [1, 2])
def test_falcon_with_eagle3_fused_features_is_lossless(k):
    """The dynamic decoder hands an EAGLE-3 drafter the wide features (the hidden state entering
    layer 1 beside f) on every path: prefill, AR steps and verified trees."""
    for kind, prompt in [("seed0", PROMPTS[0]), ("tied", PROMPTS[1])]:
        target = make_target(kind)
        for mode in ("random", "mixed"):
            drafter = falcon(target, k, "eagle3", kind, prompt, mode=mode, aux_layers=(1,))
            for cfg in (DynamicConfig(), DynamicConfig(budget=4)):
                _check(target, drafter, kind, prompt, 37, cfg, CHEAP)
            assert drafter.calls[0]["inputs"].shape[-1] == 2 * target.hidden_size


@pytest.mark.parametrize("cost", [CHEAP, DEAR], ids=["cheap", "dear"])
def test_ngram_only_is_lossless_and_pays_on_a_looping_target(cost):
    kind, prompt = "tied", PROMPTS[1]  # the tied target mostly repeats: its output loops
    res = _check(make_target(kind), None, kind, prompt, 64, DynamicConfig(), cost)
    if cost is CHEAP:
        assert res.tau > 1.5
    for kind, prompt in [("seed0", PROMPTS[0]), ("seed3", PROMPTS[1])]:
        _check(make_target(kind), None, kind, prompt, 37, DynamicConfig(), cost)


def test_a_right_drafter_is_trusted_and_a_wrong_one_is_left_for_ar_steps():
    kind, prompt = "seed0", PROMPTS[0]
    target = make_target(kind)
    cfg = DynamicConfig(ngram=0, max_nodes=8)
    right = _check(target, oracle(kind, prompt, [0, 0, 0, 0]), kind, prompt, 41, cfg, CHEAP)
    assert right.tau > 3.0
    # always wrong, decoys only: after a few verifications calibration says so, and a step that
    # costs 1.33 AR steps for one node is not worth it any more
    wrong = oracle(kind, prompt, [None] * 4)
    res = _check(target, wrong, kind, prompt, 41, cfg, [1.0] + [1.33 + 0.1 * n for n in range(9)])
    assert res.accepted_tokens == 0 and res.ar_steps > 3 * res.tree_steps


def test_falcon_right_drafter_runs_deeper_passes():
    kind, prompt, n = "seed0", PROMPTS[0], 41
    target = make_target(kind)
    drafter = falcon(target, 2, kind=kind, prompt=prompt, n=n, mode="right")
    # top-1 only, every candidate verified: each pass adds the next block of k = 2 below the
    # one anchor, and all of it is right
    cfg = DynamicConfig(ngram=0, passes=3, anchors=1, width=1, min_anchor=0.0, budget=6)
    res = _check(target, drafter, kind, prompt, n, cfg, None)
    assert res.accept_lens[:5] == [6] * 5 and res.step_nodes[:5] == [6] * 5
    shallow = DynamicConfig(ngram=0, passes=1, width=1, budget=6)
    assert set(_check(target, drafter, kind, prompt, n, shallow, None).step_nodes) == {2}
    cautious = DynamicConfig(ngram=0, passes=3, anchors=1, width=1, min_anchor=1.0, budget=6)
    assert set(_check(target, drafter, kind, prompt, n, cautious, None).step_nodes) == {2}
    # chosen budgets: the calibrated estimates of a right drafter grow, and so does the tree
    auto = DynamicConfig(ngram=0, passes=3, anchors=1, width=1, min_anchor=0.0)
    res = _check(target, drafter, kind, prompt, n, auto, CHEAP)
    assert res.accepted_tokens == sum(res.step_nodes) and res.step_nodes[-1] > res.step_nodes[0]


def test_gates_set_the_chain_the_budget_sees():
    """gate_conditionals: the learned gate's P(heads 0..i right) become the top-1 chain's
    cumulative estimates; an E[a] gate (entropy) scales the heads' conditionals by one factor so
    that the chain's expected length is E[a]."""
    from drafters.decoding.dynamic import gate_conditionals
    from drafters.models.gate import EntropyGate, LearnedGate, LearnedGateConfig

    d, v = 8, 16
    f, logits = torch.randn(1, 1, d), torch.randn(1, 1, v)
    top1 = torch.tensor([0.5, 0.4, 0.3, 0.2])
    learned = LearnedGate(LearnedGateConfig(d, num_heads=3, hidden_dim=4))
    q = torch.tensor([0.8, 0.6, 0.3])
    with torch.no_grad():  # a gate that says q whatever it reads
        learned.fc2.weight.zero_()
        learned.fc2.bias.copy_(torch.logit(q))
    c = gate_conditionals(learned, f, logits, top1)
    assert torch.allclose(c[:3].cumprod(0), q, atol=1e-6)
    assert c[3] == top1[3]  # deeper than the gate's heads: the heads' own
    entropy_gate = EntropyGate(num_heads=4)
    for e in (0.2, 1.5, 3.9):
        with torch.no_grad():
            entropy_gate.values.fill_(e)
        c = gate_conditionals(entropy_gate, f, logits, top1)
        assert float(c.cumprod(0).sum()) == pytest.approx(e, abs=1e-4)
        ratio = (c / top1)[c < 1]  # one factor for every depth, until a conditional reaches 1
        assert torch.allclose(ratio, ratio[:1].expand_as(ratio), rtol=1e-5)
    with torch.no_grad():
        entropy_gate.values.fill_(0.0)
    assert gate_conditionals(entropy_gate, f, logits, top1).sum() == 0


@pytest.mark.parametrize("gate_kind", ["learned", "entropy"])
@pytest.mark.parametrize("cost", [CHEAP, DEAR], ids=["cheap", "dear"])
def test_head_drafters_with_a_gate_are_lossless(gate_kind, cost):
    from drafters.models.gate import EntropyGate, LearnedGate, LearnedGateConfig

    for kind, prompt in [("seed0", PROMPTS[0]), ("tied", PROMPTS[1])]:
        target = make_target(kind)
        torch.manual_seed(0)
        if gate_kind == "learned":
            gate = LearnedGate(LearnedGateConfig(target.hidden_size, num_heads=4, hidden_dim=8))
        else:
            gate = EntropyGate(num_heads=4)
        for drafter in (RandomHeads(target.hidden_size, seed=1),
                        oracle(kind, prompt, [0, 1, None, 0])):  # fmt: skip
            for cfg in (DynamicConfig(), DynamicConfig(ngram=0)):
                ids, ref = reference(kind, prompt, 37)
                res = decode_dynamic(target, drafter, ids, 37, cfg, cost=cost, gate=gate)
                assert torch.equal(res.sequences, ref), (kind, gate_kind, cfg)


def test_a_gate_needs_a_head_drafter():
    from drafters.models.gate import EntropyGate

    target = make_target("seed0")
    ids, _ = reference("seed0", PROMPTS[0], 4)
    for drafter in (None, falcon(target, 2)):
        with pytest.raises(ValueError, match="gate"):
            decode_dynamic(target, drafter, ids, 4, DynamicConfig(), cost=CHEAP,
                           gate=EntropyGate())  # fmt: skip
