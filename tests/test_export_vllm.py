"""Exports to vLLM's formats (drafters/export/vllm.py): what cannot be expressed is refused by
field; the exported tensors compute what our drafter computes, read the way vLLM reads them
(Medusa: its ResidualBlock; EAGLE: transformers' Llama layers, layer 0 without input norm); and
vLLM itself loads each export and decodes losslessly (tests/test_vllm_serving.py)."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from drafters.export.format import ExportError, LoadedDrafter
from drafters.export.vllm import export_vllm
from drafters.models import (
    CerberusConfig,
    CerberusHeads,
    FalconConfig,
    FalconDrafter,
    MedusaConfig,
    MedusaHeads,
)


def loaded(kind, model, target):
    for p in model.parameters():  # away from the identity init, so every tensor matters
        torch.nn.init.normal_(p, std=0.05)
    ident = dataclasses.asdict(target.identity)
    return LoadedDrafter(
        kind, model.eval(), None, config={"target": ident, "weights": {"dtype": "float32"}}
    )


def falcon(target, **kw):
    kw = {"k": 1, "fusion_bias": False, "first_input_norm": False, **kw}
    return FalconDrafter(FalconConfig.from_target_config(target.config, **kw))


def export(tmp_path, d, target, **kw):
    return export_vllm(
        d,
        tmp_path / "out",
        target_lm_head=target.model.get_output_embeddings().weight,
        target_config=target.config.to_dict(),
        **kw,
    )


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda t: ("cerberus", CerberusHeads(CerberusConfig(t.hidden_size, t.vocab_size))),
            "kind=cerberus",
        ),
        (lambda t: ("falcon", falcon(t, k=2)), r"model.k=2"),
        (lambda t: ("falcon", falcon(t, k=2, fusion="eagle3")), r"model.k=2"),
        (lambda t: ("falcon", falcon(t, fusion="lstm")), r"model.fusion='lstm'"),
        (lambda t: ("falcon", falcon(t, fusion_bias=True)), r"model.fusion_bias=true"),
        (lambda t: ("falcon", falcon(t, first_input_norm=True)), r"model.first_input_norm=true"),
        (lambda t: ("falcon", falcon(t, draft_vocab_size=64)), r"model.draft_vocab_size=64:"),
        (
            lambda t: (
                "medusa",
                MedusaHeads(MedusaConfig(t.hidden_size, t.vocab_size, draft_vocab_size=64)),
            ),
            r"model.draft_vocab_size=64:.*--full-vocab",
        ),
        (
            lambda t: (
                "medusa",
                MedusaHeads(
                    MedusaConfig(
                        t.hidden_size, t.vocab_size, draft_vocab_size=64, trainable_lm_head=True
                    )
                ),
            ),
            r"trainable_lm_head=true",
        ),
    ],
)
def test_what_vllm_cannot_express_is_refused_by_field(tmp_path, tiny, make, match):
    kind, model = make(tiny)
    with pytest.raises(ExportError, match=match):
        export(tmp_path, loaded(kind, model, tiny), tiny, full_vocab="trainable" in match)
    assert not (tmp_path / "out").exists()


def test_speculators_format_says_the_same_drafter_and_names_its_verifier(tmp_path, tiny):
    """--format speculators: the plain EAGLE-3 export's weights; its config turns, by vLLM's
    rules (SpeculatorsConfig: the layer config, then the EAGLE-3 fields), into the plain
    export's Llama config, and names the verifier and the draft tokens; a drafter without fused
    layers is refused, naming the field."""
    model = falcon(tiny, fusion="eagle3", draft_vocab_size=64, aux_layers=(1,))
    d = loaded("falcon", model, tiny)
    plain = export(tmp_path, d, tiny)
    spec = export_vllm(d, tmp_path / "spec", target_lm_head=tiny.lm_head.weight,
                       target_config=tiny.config.to_dict(), verifier="/models/t",
                       speculative_tokens=4)  # fmt: skip
    a, b = load_file(str(plain / "model.safetensors")), load_file(str(spec / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    config = json.loads((spec / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["verifier"]["name_or_path"] == "/models/t"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    # vLLM: transformer_layer_config, updated by update_eagle3 (the fields it reads, with its
    # defaults), must give the plain export's config
    vllm = dict(config["transformer_layer_config"])
    for key, default in (("draft_vocab_size", None), ("target_hidden_size", None),
                         ("norm_before_residual", True), ("norm_before_fc", False),
                         ("fc_norm", False), ("norm_output", False),
                         ("eagle_aux_hidden_state_layer_ids", None)):  # fmt: skip
        vllm[key] = config.get(key, default)
    want = json.loads((plain / "config.json").read_text())
    del want["eagle_config"], want["num_aux_hidden_states"], want["architectures"]
    vllm.pop("architectures"), vllm.pop("norm_before_fc")
    assert vllm == want
    assert json.loads((spec / "drafters_source.json").read_text())["format"] == "speculators"
    no_aux = loaded("falcon", falcon(tiny, fusion="eagle3"), tiny)
    with pytest.raises(ExportError, match="fusion/aux_layers:"):
        export_vllm(no_aux, tmp_path / "x", target_lm_head=tiny.lm_head.weight,
                    target_config=tiny.config.to_dict(), verifier="/models/t")  # fmt: skip


def test_an_existing_folder_needs_force(tmp_path, tiny):
    d = loaded("medusa", MedusaHeads(MedusaConfig(tiny.hidden_size, tiny.vocab_size)), tiny)
    export(tmp_path, d, tiny)
    with pytest.raises(FileExistsError, match="--force"):
        export(tmp_path, d, tiny)
    export(tmp_path, d, tiny, force=True)


@pytest.mark.parametrize("trainable", [False, True])
def test_medusa_tensors_compute_our_logits(tmp_path, tiny, trainable):
    cfg = MedusaConfig(
        tiny.hidden_size, tiny.vocab_size, num_heads=3, num_layers=2, trainable_lm_head=trainable
    )
    d = loaded("medusa", MedusaHeads(cfg), tiny)
    out = export(tmp_path, d, tiny)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["num_heads"] == 3
    assert (
        config["num_hidden_layers"] == 2 and config["medusa_fc_bias"] and config["original_lm_head"]
    )
    w = load_file(str(out / "model.safetensors"))
    f = torch.randn(2, 5, tiny.hidden_size)
    ours = d.model(f, tiny.lm_head)  # (B, T, K, V)
    for h in range(3):  # vLLM's ResidualBlock, then the one shared head
        x = f
        for layer in range(2):
            p = f"blocks.{h}.layers.{layer}"
            x = x + F.silu(F.linear(x, w[f"{p}.weight"], w[f"{p}.bias"]))
        torch.testing.assert_close(F.linear(x, w["lm_heads.0.weight"]), ours[:, :, h])


def test_medusa_full_vocab_scores_every_target_token(tmp_path, tiny):
    cfg = MedusaConfig(tiny.hidden_size, tiny.vocab_size, draft_vocab_size=64)
    d = loaded("medusa", MedusaHeads(cfg), tiny)
    out = export(tmp_path, d, tiny, full_vocab=True)
    w = load_file(str(out / "model.safetensors"))
    assert torch.equal(w["lm_heads.0.weight"], tiny.lm_head.weight)
    assert "token_map" not in w
    assert json.loads((out / "drafters_source.json").read_text())["full_vocab"] is True


def test_eagle_tensors_compute_our_falcon_k1(tmp_path, smollm2):
    """Our k=1 Falcon == vLLM's EAGLE drafter read from the export: fc over cat(embedding,
    feature) without bias, transformers' Llama layers (layer 0 with no input norm), no final
    norm; causal attention, positions 0..T-1."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    t = smollm2
    d = loaded("falcon", falcon(t), t)
    out = export(tmp_path, d, t)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    w = load_file(str(out / "model.safetensors"))
    assert "layers.0.input_layernorm.weight" not in w and "fc.bias" not in w
    assert "embed_tokens.weight" not in w and "lm_head.weight" not in w  # vLLM shares the target's

    hf = LlamaConfig(
        **{k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    )
    hf._attn_implementation = "eager"
    layers = [LlamaDecoderLayer(hf, i).eval() for i in range(2)]
    for i, layer in enumerate(layers):
        state = {
            k.removeprefix(f"layers.{i}."): v for k, v in w.items() if k.startswith(f"layers.{i}.")
        }
        if i == 0:
            layer.input_layernorm = torch.nn.Identity()
        layer.load_state_dict(state, strict=True)
    T = 7
    f = torch.randn(1, T, t.hidden_size)
    tokens = torch.randint(t.vocab_size, (1, T))
    pos = torch.arange(T).unsqueeze(0)
    with torch.no_grad():
        x = F.linear(torch.cat([t.embed_tokens(tokens), f], dim=-1), w["fc.weight"])
        cos_sin = LlamaRotaryEmbedding(hf)(x, pos)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        for layer in layers:
            x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
            x = x[0] if isinstance(x, tuple) else x
        ours = d.model(f, tokens, t.embed_tokens)
    torch.testing.assert_close(x, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("aux_layers", [None, (2, 15, 27)])
def test_eagle3_tensors_compute_our_falcon_k1_with_its_draft_vocabulary(
    tmp_path, smollm2, aux_layers
):
    """Our k=1 Falcon with fusion=eagle3 == vLLM's Eagle3LlamaForCausalLM read from the export
    (the plain format, norm_before_residual false, norm_output true): layer 0's q/k/v over
    [input_layernorm(embedding) ; hidden_norm(feature)], residual from the raw feature; a Llama
    layer; the final norm; lm_head of the draft vocabulary's rows, scattered to target ids by
    d2t (target id = draft id + d2t). The feature: the target's last hidden state
    (use_aux_hidden_state false), or with aux layers vLLM's combine_hidden_states (fc_norm: an
    RMSNorm per aux hidden state, then fc) over the hidden states of those layers."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer,
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    t = smollm2
    model = falcon(t, fusion="eagle3", draft_vocab_size=256, aux_layers=aux_layers)
    ids = torch.randperm(t.vocab_size)[:256].sort().values
    model.vocab.set_ids(ids)
    if aux_layers:  # norms away from 1, so a misnamed one would show
        with torch.no_grad():
            for norm in model.fc_norm:
                norm.weight.uniform_(0.5, 1.5)
    d = loaded("falcon", model, t)
    out = export(tmp_path, d, t)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 256 and config["vocab_size"] == t.vocab_size
    if aux_layers:
        assert config["eagle_config"] == {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": list(aux_layers),
        }
        assert config["fc_norm"] is True and config["num_aux_hidden_states"] == 3
    else:
        assert config["eagle_config"] == {"use_aux_hidden_state": False}
    assert config["norm_output"] is True and config["norm_before_residual"] is False
    source = json.loads((out / "drafters_source.json").read_text())
    assert source["vllm_method"] == "eagle3"
    w = load_file(str(out / "model.safetensors"))
    assert ("fc.weight" in w) == bool(aux_layers) and "embed_tokens.weight" not in w
    assert w["d2t"].dtype == torch.int64 and torch.equal(w["d2t"] + torch.arange(256), ids)

    hf = LlamaConfig(**{k: v for k, v in config.items() if k in LlamaConfig().to_dict()})
    hf._attn_implementation = "eager"
    T, H, Hkv, hd = 7, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim

    def rms(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + hf.rms_norm_eps)

    f = torch.randn(1, T, t.hidden_size)
    ours_in = f  # what our drafter is given: f, or wide [f ; h_2 ; h_15 ; h_27]
    if aux_layers:
        h = [torch.randn(1, T, t.hidden_size) * s for s in (1.0, 10.0, 100.0)]
        ours_in = torch.cat([torch.randn(1, T, t.hidden_size)] + h, dim=-1)
        normed = [rms(x, w[f"fc_norm.{i}.weight"]) for i, x in enumerate(h)]
        f = F.linear(torch.cat(normed, dim=-1), w["fc.weight"])  # combine_hidden_states
    tokens = torch.randint(t.vocab_size, (1, T))
    pos = torch.arange(T).unsqueeze(0)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        e = t.embed_tokens(tokens)
        p = "layers.0."
        u = torch.cat([rms(e, w[p + "input_layernorm.weight"]),
                       rms(f, w[p + "hidden_norm.weight"])], dim=-1)  # fmt: skip
        q = F.linear(u, w[p + "self_attn.q_proj.weight"]).view(1, T, H, hd).transpose(1, 2)
        k = F.linear(u, w[p + "self_attn.k_proj.weight"]).view(1, T, Hkv, hd).transpose(1, 2)
        v = F.linear(u, w[p + "self_attn.v_proj.weight"]).view(1, T, Hkv, hd).transpose(1, 2)
        cos, sin = LlamaRotaryEmbedding(hf)(f, pos)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = f + F.linear(a.transpose(1, 2).reshape(1, T, -1), w[p + "self_attn.o_proj.weight"])
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + F.linear(
            F.silu(F.linear(m, w[p + "mlp.gate_proj.weight"]))
            * F.linear(m, w[p + "mlp.up_proj.weight"]),
            w[p + "mlp.down_proj.weight"],
        )
        layer = LlamaDecoderLayer(hf, 1).eval()
        layer.load_state_dict({k.removeprefix("layers.1."): v for k, v in w.items()
                               if k.startswith("layers.1.")}, strict=True)  # fmt: skip
        x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
        x = rms(x[0] if isinstance(x, tuple) else x, w["norm.weight"])
        vllm_logits = torch.full((1, T, t.vocab_size), float("-inf"))
        vllm_logits[..., w["d2t"] + torch.arange(256)] = F.linear(x, w["lm_head.weight"])
        ours = d.model(ours_in, tokens, t.embed_tokens)
        our_logits = d.model.scoring_head(t.lm_head)(ours)
    torch.testing.assert_close(x, ours, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(vllm_logits.argmax(-1), ids[our_logits.argmax(-1)])
