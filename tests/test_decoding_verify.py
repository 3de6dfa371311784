"""Tree verification on the stock HF forward: acceptance, KV pruning, returned features/logits."""

import pytest
import torch

from drafters.decoding.cache import keep_kv, new_cache, target_forward
from drafters.decoding.tree import TreeLayout, get_tree
from drafters.decoding.verify import tree_attention_mask, verify_tree
from drafters.testing import tiny_target

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def setup(request):
    target = tiny_target(seed=0)
    target.model.set_attn_implementation(request.param)
    ids = target.tokenizer(PROMPT, return_tensors="pt").input_ids  # (1, P)
    out = target.model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12
    )
    return target, ids, out[0, ids.shape[1] :].tolist()


def _prefill(target, ids):
    cache = new_cache(target)
    with torch.inference_mode():
        target_forward(target, cache, ids)
    return cache


def _wrong(token):
    return (token + 101) % 259


def test_mask_layout():
    layout = TreeLayout.from_parents([-1, 0, 1, 0])
    mask = tree_attention_mask(layout, past_len=2, dtype=torch.float32, device="cpu")
    allowed = mask[0, 0] == 0
    assert mask.shape == (1, 1, 4, 6)
    assert allowed.tolist() == [
        [True, True, True, False, False, False],
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, False, False, True],
    ]
    assert mask[0, 0, 0, 3] == torch.finfo(torch.float32).min


@torch.inference_mode()
def test_accept_prune_and_next_step_match_causal_forward(setup):
    target, ids, g = setup  # g: greedy continuation; g[0] comes from the prefill
    P = ids.shape[1]
    cache = _prefill(target, ids)
    # node: 0 root g0 | 1 g1 ok | 2 wrong | 3 wrong (under 1) | 4 g2 ok (under 1)
    #       5 g3 (under the wrong 3) | 6 g3 ok (under 4) | 7 g2 (under the wrong 2)
    parents = [-1, 0, 0, 1, 1, 3, 4, 2]
    tokens = torch.tensor([g[0], g[1], _wrong(g[1]), _wrong(g[2]), g[2], g[3], g[3], g[2]])
    v = verify_tree(target, cache, tokens, TreeLayout.from_parents(parents))
    assert v.path.tolist() == [0, 1, 4, 6]
    assert v.accepted == g[1:4] and v.bonus == g[4]
    assert cache.get_seq_length() == P + 4  # prefix + root + 3 accepted; bonus not fed yet

    full = torch.cat([ids, torch.tensor([g[:4]])], dim=1)
    f_ref, logits_ref = target.features(full, return_logits=True)
    torch.testing.assert_close(v.features, f_ref[:, P : P + 4], atol=1e-4, rtol=0)
    torch.testing.assert_close(v.logits, logits_ref[:, -1:], atol=1e-4, rtol=0)

    # next step on the pruned cache: root g4, a chain g5 g6 beside a wrong sibling
    tokens = torch.tensor([g[4], _wrong(g[5]), g[5], g[6]])
    v2 = verify_tree(target, cache, tokens, TreeLayout.from_parents([-1, 0, 0, 2]))
    assert v2.path.tolist() == [0, 2, 3] and v2.bonus == g[7]
    assert cache.get_seq_length() == P + 7
    full = torch.cat([ids, torch.tensor([g[:7]])], dim=1)
    f_ref, logits_ref = target.features(full, return_logits=True)
    torch.testing.assert_close(v2.features, f_ref[:, P + 4 : P + 7], atol=1e-4, rtol=0)
    torch.testing.assert_close(v2.logits, logits_ref[:, -1:], atol=1e-4, rtol=0)
    # the pruned cache holds exactly what a causal forward of the sequence would
    ref_cache = _prefill(target, full)
    for layer, ref in zip(cache.layers, ref_cache.layers, strict=True):
        torch.testing.assert_close(layer.keys, ref.keys, atol=1e-4, rtol=0)
        torch.testing.assert_close(layer.values, ref.values, atol=1e-4, rtol=0)


@torch.inference_mode()
def test_nothing_accepted_keeps_root_only(setup):
    target, ids, g = setup
    cache = _prefill(target, ids)
    tree = get_tree("mc_sim_7b_63")
    tokens = torch.full((len(tree) + 1,), _wrong(g[1]))
    tokens[0] = g[0]
    v = verify_tree(target, cache, tokens, tree.layout)
    assert v.path.tolist() == [0] and v.accepted == [] and v.bonus == g[1]
    assert cache.get_seq_length() == ids.shape[1] + 1


@torch.inference_mode()
def test_every_root_to_leaf_path_matches_causal_forward(setup):
    """The 4D tree mask + depth positions give each path the logits of a plain forward."""
    target, ids, _ = setup
    tree = get_tree("mc_sim_7b_63_first16")
    tokens = torch.randint(3, 259, (len(tree) + 1,), generator=torch.Generator().manual_seed(0))
    cache = _prefill(target, ids)
    P = ids.shape[1]
    layout = tree.layout
    mask = tree_attention_mask(layout, P, target.dtype, target.device)
    f = target_forward(target, cache, tokens[None], (P + layout.depth)[None], mask)
    logits = target.lm_head(f)[0]  # (n, V)
    for row in tree.retrieve.tolist():
        path = [i for i in row if i >= 0]
        ref = target.features(torch.cat([ids, tokens[path][None]], 1), return_logits=True)[1]
        torch.testing.assert_close(logits[path], ref[0, P:], atol=1e-4, rtol=0)
    keep_kv(cache, P, torch.zeros(0, dtype=torch.long))
    assert cache.get_seq_length() == P


def test_in_place_cache_equals_hf_dynamic_cache_across_growth_and_pruning():
    """new_cache's in-place layers give the same forwards as HF's DynamicCache through buffer
    growth (past 256 entries), tree pruning (keep_kv moves) and a replaced tensor."""
    from transformers import DynamicCache

    from drafters.decoding.cache import InPlaceLayer

    target = tiny_target(seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 250, (1, 200), generator=g)
    ours, ref = new_cache(target), DynamicCache(config=target.config)
    assert all(isinstance(layer, InPlaceLayer) for layer in ours.layers)
    with torch.inference_mode():
        for cache in (ours, ref):
            target_forward(target, cache, ids)
        for step in range(40):
            tokens = torch.randint(3, 250, (1, 3), generator=g)
            out = [target_forward(target, c, tokens) for c in (ours, ref)]
            torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=0)
            past = ours.get_seq_length() - 3
            keep = torch.tensor([0, 2]) if step % 2 else torch.tensor([0])
            for c in (ours, ref):
                keep_kv(c, past, keep)
            if step == 20:  # a tensor that is no view of the buffer is adopted, not lost
                layer = ours.layers[0]
                layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        assert ours.get_seq_length() == ref.get_seq_length() > 256
        for a, b in zip(ours.layers, ref.layers, strict=True):
            torch.testing.assert_close(a.keys, b.keys)
            torch.testing.assert_close(a.values, b.values)
