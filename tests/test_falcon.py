import dataclasses

import pytest
import torch
from torch import nn

from drafters.models import FalconConfig, FalconDrafter, block_causal_mask, build_drafter
from drafters.models.falcon import num_params
from drafters.models.kv_cache import FalconKVCache
from drafters.models.llama import RMSNorm

D, V = 16, 30


def _cfg(**kw):
    base = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=24)
    return FalconConfig(D, V, **{**base, **kw})


def _drafter(seed=0, **kw):
    torch.manual_seed(seed)
    return FalconDrafter(_cfg(**kw)).eval()


def _inputs(B=2, T=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    embed = nn.Embedding(V, D).requires_grad_(False)
    return torch.randn(B, T, D, generator=g), torch.randint(0, V, (B, T), generator=g), embed


def test_block_causal_mask_exact_patterns():
    assert torch.equal(block_causal_mask(5, 1), torch.ones(5, 5, dtype=torch.bool).tril())
    k2 = torch.tensor(
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    )
    assert torch.equal(block_causal_mask(5, 2).long(), k2)
    k3 = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1, 1],
        ]
    )
    assert torch.equal(block_causal_mask(7, 3).long(), k3)
    # 3 new positions after 3 cached, k = 2: absolute 3 is in block [2 3], 4 and 5 in [4 5]
    want = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    assert torch.equal(block_causal_mask(3, 2, past_len=3).long(), want)
    assert torch.equal(block_causal_mask(4, 2, past_len=3), block_causal_mask(7, 2)[3:])


@pytest.mark.parametrize("fusion", ["linear", "lstm", "eagle3"])
def test_shapes_and_num_params(fusion):
    m = _drafter(fusion=fusion)
    f, t, embed = _inputs()
    assert m(f, t, embed).shape == f.shape
    assert sum(p.numel() for p in m.parameters()) == num_params(m.cfg) == m.cfg.num_params()
    layer = D * 4 * (2 * 4 + 2 * 2) + 3 * D * 24 + 2 * D  # hd = 16 / 4
    # eagle3: no fusion; layer 0's q, k, v read 2D, its hidden_norm, the final norm
    fuse = {"linear": 2 * D * D + D, "lstm": 12 * D * D + 8 * D}.get(fusion)
    fuse = D * 4 * (4 + 2 * 2) + 2 * D if fuse is None else fuse
    assert m.cfg.num_params() == fuse + 2 * layer


def test_eagle3_layout_reads_both_inputs_normalised_and_ends_normalised():
    """fusion=eagle3: no fusion layer; layer 0's attention reads [norm(emb) ; norm(f)] and its
    residual starts at the raw feature; the output is RMS-normalised (its norm's weight)."""
    m = _drafter(fusion="eagle3", k=1)
    assert m.fusion is None and m.layers[0].self_attn.q_proj.in_features == 2 * D
    f, t, embed = _inputs()
    out = m(f, t, embed)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(out.shape[:2]))
    scaled = m(f * 3.0, t, embed)  # only the residual sees the feature's scale
    assert not torch.allclose(out, scaled, atol=1e-4)
    with torch.no_grad():
        m.layers[0].hidden_norm.weight.mul_(2.0)
    assert not torch.allclose(out, m(f, t, embed), atol=1e-4)


def test_eagle3_fused_features_replace_f_on_true_inputs_only():
    """aux_layers: wide true inputs [f ; h_a ; h_b] become fc([norm(h_a) ; norm(h_b)]) (f itself
    unread: only a target there), d-wide inputs (the drafter's own) pass as they are; the
    parameter count says so; aux layers need the eagle3 layout."""
    m = _drafter(fusion="eagle3", k=1, aux_layers=[3, 5])
    assert m.cfg.aux_layers == (3, 5) and m.fc.weight.shape == (D, 2 * D)
    assert sum(p.numel() for p in m.parameters()) == m.cfg.num_params()
    plain = _drafter(fusion="eagle3", k=1)
    assert m.cfg.num_params() - plain.cfg.num_params() == 2 * D * D + 2 * D
    f, t, embed = _inputs()
    h = torch.randn(2, 8, 2 * D)
    wide = torch.cat([f, h], dim=-1)
    fused = m.fc(torch.cat([m.fc_norm[0](h[..., :D]), m.fc_norm[1](h[..., D:])], dim=-1))
    torch.testing.assert_close(m.inputs(wide), fused)
    torch.testing.assert_close(m(wide, t, embed), m(fused, t, embed))
    torch.testing.assert_close(m(wide, t, embed), m(torch.cat([f * 5, h], -1), t, embed))
    assert m.inputs(f) is f
    assert plain.inputs(wide) is wide  # no aux layers: nothing to fuse
    short = rf"width {2 * D}: .* layers \(3, 5\), so true features come {3 * D} wide"
    with pytest.raises(ValueError, match=short):
        m.inputs(wide[..., : 2 * D])  # one aux layer short
    for kw in (dict(fusion="linear", aux_layers=[3]), dict(fusion="eagle3", aux_layers=[])):
        with pytest.raises(ValueError, match="needs fusion='eagle3' and at least one layer"):
            _cfg(**kw)


def test_eagle_layout_drops_the_fusion_bias_and_layer0_input_norm():
    """fusion_bias=False, first_input_norm=False (EAGLE's layout, what vLLM serves): layer 0 sees
    the fusion's output unnormalised; the parameter count says so."""
    m = _drafter(k=1, fusion_bias=False, first_input_norm=False)
    assert m.fusion.bias is None and isinstance(m.layers[0].input_layernorm, torch.nn.Identity)
    assert isinstance(m.layers[1].input_layernorm, RMSNorm)
    assert sum(p.numel() for p in m.parameters()) == m.cfg.num_params()
    with_norm = _drafter(k=1, fusion_bias=False, first_input_norm=True)
    missing, unexpected = with_norm.load_state_dict(m.state_dict(), strict=False)
    assert missing == ["layers.0.input_layernorm.weight"] and not unexpected
    f, t, embed = _inputs()
    assert not torch.allclose(m(f, t, embed), with_norm(f, t, embed))


def test_from_target_config_and_build():
    from transformers import LlamaConfig

    hf = LlamaConfig(
        hidden_size=576,
        vocab_size=49152,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
    )
    cfg = FalconConfig.from_target_config(hf, k=3, fusion="lstm")
    assert (cfg.hidden_size, cfg.vocab_size, cfg.head_dim, cfg.k) == (576, 49152, 64, 3)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.rope_theta) == (3, 1536, 1e5)
    assert cfg.rms_norm_eps == 1e-5 and cfg.fusion == "lstm"
    small = _cfg(k=3)
    m = build_drafter("falcon", dataclasses.asdict(small))
    assert isinstance(m, FalconDrafter) and m.cfg == small
    with pytest.raises(ValueError):
        FalconConfig(D, V, fusion="gru")


def test_target_weights_never_in_state_dict():
    f, t, embed = _inputs()
    m = _drafter()
    m(f, t, embed)
    assert all(V not in p.shape for p in m.state_dict().values())
    assert not any(p is embed.weight for p in m.parameters())


@pytest.mark.parametrize("k", [1, 2, 3])
def test_forward_dependencies_follow_the_block_mask(k):
    m = _drafter(k=k)
    f, t, embed = _inputs(B=1, T=7)
    base = m(f, t, embed)
    allowed = block_causal_mask(7, k)
    for p in range(7):
        f2 = f.clone()
        f2[0, p] += 1.0
        out = m(f2, t, embed)
        changed = (out - base).abs().amax(-1)[0] > 1e-6  # (T,) queries
        assert torch.equal(changed, allowed[:, p]), (k, p)


@pytest.mark.parametrize("k", [2, 3])
def test_reversed_assignment_reorders_each_block(k):
    """Same weights: the reversed drafter's output j is the paper drafter's output at the
    mirrored slot of j's block, so the last slot (the freshest pair) predicts offset 1; left
    padding moves the blocks with the position ids."""
    torch.manual_seed(0)
    paper = _drafter(k=k)
    cfg = dataclasses.replace(paper.cfg, assignment="reversed")
    rev = FalconDrafter(cfg)
    rev.load_state_dict(paper.state_dict())
    T = 4 * k
    f, t, embed = _inputs(B=1, T=T)
    a, b = paper(f, t, embed), rev(f, t, embed)
    for j in range(T):
        q = j % k
        torch.testing.assert_close(b[0, j], a[0, j + k - 1 - 2 * q])
    pad = torch.ones(1, T + 1, dtype=torch.long)
    pad[0, 0] = 0  # one left pad: blocks start at index 1
    fp, tp = torch.cat([f[:, :1], f], 1), torch.cat([t[:, :1], t], 1)
    torch.testing.assert_close(rev(fp, tp, embed, pad)[:, 1:], b, atol=1e-5, rtol=0)


def test_lstm_is_batch_first_with_a_real_recurrence():
    m = _drafter(fusion="lstm", k=1)
    assert m.fusion.batch_first
    f, t, embed = _inputs(B=2, T=6)
    base = m(f, t, embed)
    f2 = f.clone()
    f2[0, 0] += 1.0
    out = m(f2, t, embed)
    assert torch.allclose(out[1], base[1])  # rows independent (the released code's bug)
    # the fusion alone (no attention) carries position 0 into position 5: a real recurrence
    x = torch.cat([f, embed(t)], -1)
    x2 = torch.cat([f2, embed(t)], -1)
    assert not torch.allclose(m.fusion(x)[0][0, 5], m.fusion(x2)[0][0, 5])


@pytest.mark.parametrize("fusion", ["linear", "lstm"])
def test_right_padding_matches_unpadded(fusion):
    m = _drafter(fusion=fusion)
    f, t, embed = _inputs(B=2, T=8)
    am = torch.ones(2, 8, dtype=torch.long)
    am[1, 5:] = 0
    out = m(f, t, embed, attention_mask=am)
    torch.testing.assert_close(out[1, :5], m(f[1:, :5], t[1:, :5], embed)[0])
    torch.testing.assert_close(out[0], m(f[:1], t[:1], embed)[0])


def test_left_padding_matches_unpadded_linear_and_lstm_refuses():
    m = _drafter()
    f, t, embed = _inputs(B=2, T=8)
    am = torch.ones(2, 8, dtype=torch.long)
    am[1, :3] = 0
    out = m(f, t, embed, attention_mask=am)
    torch.testing.assert_close(out[1, 3:], m(f[1:, 3:], t[1:, 3:], embed)[0])
    with pytest.raises(ValueError, match="right padding"):
        _drafter(fusion="lstm")(f, t, embed, attention_mask=am)


@pytest.mark.parametrize("fusion", ["linear", "lstm"])
@pytest.mark.parametrize("k", [2, 3])
def test_cache_chunks_equal_full_forward(fusion, k):
    m = _drafter(fusion=fusion, k=k)
    f, t, embed = _inputs(B=1, T=3 * k)
    full = m(f, t, embed)
    cache = m.new_cache()
    a = m(f[:, :k], t[:, :k], embed, cache=cache)
    b = m(f[:, k:], t[:, k:], embed, cache=cache)
    assert cache.length == 3 * k
    torch.testing.assert_close(torch.cat([a, b], 1), full)


def test_cache_crop_keep_and_attn_bias_override():
    m = _drafter(k=2)
    f, t, embed = _inputs(B=1, T=6)
    full = m(f, t, embed)
    cache = m.new_cache()
    m(f[:, :4], t[:, :4], embed, cache=cache)
    m(f[:, 4:], t[:, 4:] + 1, embed, cache=cache)  # a speculative pass, to be discarded
    cache.crop(4)
    torch.testing.assert_close(m(f[:, 4:], t[:, 4:], embed, cache=cache), full[:, 4:])
    # keep(): drop positions 4, 5 by index, re-run; then a tree-style additive float bias
    cache.keep(torch.arange(4))
    assert cache.length == 4
    bias = torch.zeros(1, 1, 2, 6)
    bias[..., 4:] = torch.where(block_causal_mask(2, 2, 4)[:, 4:], 0.0, float("-inf"))
    out = m(f[:, 4:], t[:, 4:], embed, cache=cache, attn_bias=bias)
    torch.testing.assert_close(out, full[:, 4:])
    cache.crop(4)
    bool_bias = block_causal_mask(2, 2, 4).view(1, 1, 2, 6)
    torch.testing.assert_close(
        m(f[:, 4:], t[:, 4:], embed, cache=cache, attn_bias=bool_bias), full[:, 4:]
    )
    k5 = cache.keys[1][:, :, 5].clone()
    cache.keep(torch.tensor([[0, 1, 2, 3, 5]]))  # per-row indices
    assert cache.length == 5 and torch.equal(cache.keys[1][:, :, 4], k5)


def test_lstm_cache_state_rules():
    m = _drafter(fusion="lstm", k=2)
    f, t, embed = _inputs(B=1, T=6)
    cache = m.new_cache()
    m(f[:, :4], t[:, :4], embed, cache=cache)
    assert cache.lstm_length == 4
    tree = torch.ones(1, 1, 2, 6, dtype=torch.bool)
    m(f[:, 4:], t[:, 4:], embed, cache=cache, attn_bias=tree)  # tree pass: state untouched
    assert cache.lstm_length == 4 and cache.length == 6
    with pytest.raises(ValueError, match="crop"):
        m(f[:, 4:], t[:, 4:], embed, cache=cache)
    cache.crop(4)
    torch.testing.assert_close(m(f[:, 4:], t[:, 4:], embed, cache=cache), m(f, t, embed)[:, 4:])


def test_in_place_cache_matches_concatenation_through_crop_and_keep():
    """Without autograd the cache writes into buffers; the entries equal plain concatenation."""
    g = torch.Generator().manual_seed(0)
    cache, want = FalconKVCache(1), torch.zeros(1, 2, 0, 4)
    with torch.inference_mode():
        for step in range(30):
            k = torch.randn(1, 2, 5, 4, generator=g)
            cache.update(0, k, k + 1)
            want = torch.cat([want, k], dim=2)
            if step % 3 == 1:
                cache.crop(want.shape[2] - 2)
                want = want[:, :, :-2]
            if step in (2, 12):
                idx = torch.arange(0, cache.length, 2)
                cache.keep(idx)
                want = want[:, :, idx]
            assert torch.equal(cache.keys[0], want) and torch.equal(cache.values[0], want + 1)
        assert cache.length > 64  # past the first buffer
