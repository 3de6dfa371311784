"""Our exported drafter (the source of truth, `format.py`) -> a folder vLLM loads as its drafter.

    export_vllm("outputs/medusa_smollm2", "outputs/medusa_smollm2-vllm")   # or drafters-export
    LLM(model=TARGET, speculative_config={"method": "medusa" | "eagle",
                                          "model": "outputs/medusa_smollm2-vllm",
                                          "num_speculative_tokens": N})

What vLLM (0.32) can express, read from its `transformers_utils/configs/medusa.py`,
`model_executor/models/medusa.py` and `model_executor/models/llama_eagle.py`:

- Medusa heads -> `model_type: medusa`. Head h is `blocks.{h}.layers.{l}` ResBlocks
  (x + SiLU(W x + b), `medusa_fc_bias: true` for our biases) over the target's final (post-norm)
  hidden state, then one LM head shared by every head (`original_lm_head: true`,
  `lm_heads.0.weight`): the target's own, or our trainable copy. vLLM drafts the top-1 token of
  each head: a chain of `num_heads` tokens, never a tree. vLLM's own draft vocabulary for Medusa
  (`truncated_vocab_size` + a `token_map` tensor) does not load in 0.32: the loader makes
  `token_map` a parameter after collecting what it loaded, then refuses the checkpoint
  ("Following weights were not initialized from checkpoint: {'token_map'}").
- Falcon with k = 1 -> an EAGLE-1 Llama drafter (a Llama config; `method: eagle`): fusion
  `fc` over cat(embedding, feature) (ours reads cat(feature, embedding): the columns are swapped),
  no fc bias, no input norm in layer 0, no final norm, the target's embedding and LM head
  (shared by vLLM, so not written). Our k = 1 with `fusion_bias=false, first_input_norm=false`
  (conf/experiment/falcon_k1_smollm2.yaml) is exactly that; vLLM drafts a chain of
  `num_speculative_tokens` by feeding the drafter its own outputs, as our Falcon decoder does.
- Falcon with k = 1 and `fusion: eagle3` -> an EAGLE-3 Llama drafter (`method: eagle3`,
  `llama_eagle3.py`, its plain format): layer 0's q/k/v read [input_layernorm(embedding) ;
  hidden_norm(feature)], its residual starts at the raw feature (`norm_before_residual: false`),
  later layers are Llama layers, a final `norm`, and its own `lm_head` of `draft_vocab_size`
  rows with `d2t` (target id = draft id + d2t[draft id]): the draft vocabulary is served, so a
  drafting step costs its rows, not the target's 49,152. Without `aux_layers`,
  `eagle_config.use_aux_hidden_state: false`: the drafter reads the target's last (post-norm)
  hidden state, as we train it. With them, EAGLE-3's fused features: `use_aux_hidden_state:
  true`, `eagle_aux_hidden_state_layer_ids` (vLLM collects the residual stream entering those
  target layers, as `drafters.target.with_aux`), `fc_norm: true` with `fc_norm.{i}` (an RMSNorm
  per layer) and `fc` (n d -> d). `norm_output: true`: each later step reads the drafter's
  normalised output, which is what our drafter outputs and the decoder feeds back.
- vllm speculators' format (`verifier=...`, `drafters-export --format speculators`): the same
  weights with a speculators config.json (`speculators_model_type: eagle3`, the Llama layer
  config under `transformer_layer_config`, the EAGLE-3 fields, and `speculators_config` naming
  the verifier, i.e. the target, and the number of draft tokens). vLLM maps it onto the same
  Eagle3LlamaForCausalLM, and serves the folder alone: `vllm serve OUT` / `LLM(model=OUT)` loads
  the verifier it names with the drafter. Its EAGLE-3 always reads fused target layers (it has
  no `use_aux_hidden_state`), so only a drafter with `aux_layers` is written in it.

Not expressible, refused naming the field: Cerberus (its heads read each other's hidden state;
no engine links heads), Falcon k >= 2 (the block-causal mask: the k tokens of a pass attend to
each other, and an engine would need to run k draft positions per pass under that mask), the
LSTM fusion, a fusion bias or a layer-0 input norm (EAGLE's layout has neither), and a draft
vocabulary outside the eagle3 layout (vLLM's EAGLE-1 drafter has none, and its Medusa one does
not load): `full_vocab=True` exports the drafter scoring every target token with the target's
head, which can change what it proposes from what was measured with the draft vocabulary (a
trainable head of V_d rows cannot).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from drafters.export.format import DTYPES, ExportError, LoadedDrafter, load_drafter
from drafters.io_utils import staged_dir

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SOURCE_FILE = "drafters_source.json"  # where the folder came from (ours, not read by vLLM)


def vllm_method(loaded: LoadedDrafter) -> str:
    """The `speculative_config["method"]` that loads this drafter's export."""
    if loaded.kind == "falcon":
        return "eagle3" if loaded.model.cfg.fusion == "eagle3" else "eagle"
    return loaded.kind  # medusa (Cerberus is refused before this is asked)


def _refuse(folder, field: str, why: str) -> ExportError:
    return ExportError(f"{folder}: cannot export to vLLM: {field} {why}")


def medusa_tensors(loaded: LoadedDrafter, lm_head_weight: torch.Tensor | None) -> dict:
    """vLLM Medusa weight names -> tensors (contiguous, cloned)."""
    m, cfg = loaded.model, loaded.model.cfg
    out = {}
    for h, head in enumerate(m.heads):
        for j, block in enumerate(head):
            out[f"blocks.{h}.layers.{j}.weight"] = block.linear.weight
            out[f"blocks.{h}.layers.{j}.bias"] = block.linear.bias
    if m.lm_head is not None:  # our trainable copy (never with a draft vocabulary: refused)
        out["lm_heads.0.weight"] = m.lm_head.weight
    else:
        if lm_head_weight is None:
            raise ValueError("a Medusa drafter without its own LM head needs the target's")
        if tuple(lm_head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ExportError(
                f"{loaded.folder}: the target's LM head is {tuple(lm_head_weight.shape)}, the "
                f"drafter expects ({cfg.vocab_size}, {cfg.hidden_size})"
            )
        out["lm_heads.0.weight"] = lm_head_weight
    return out


def medusa_config(loaded: LoadedDrafter) -> dict:
    cfg = loaded.model.cfg
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": True,
    }
    return config


def check_falcon(loaded: LoadedDrafter, full_vocab: bool) -> None:
    cfg, where = loaded.model.cfg, loaded.folder
    if cfg.k != 1:
        raise _refuse(
            where,
            f"model.k={cfg.k}:",
            "vLLM drafts one token per drafter pass (EAGLE); a Falcon block of k >= 2 needs "
            "the block-causal mask, which no engine runs. Train k=1 "
            "(python train.py +experiment=falcon_k1_smollm2)",
        )
    if cfg.fusion == "eagle3":
        return  # every setting maps (the draft vocabulary too: d2t)
    if cfg.fusion != "linear":
        raise _refuse(
            where,
            f"model.fusion={cfg.fusion!r}:",
            "EAGLE's fusion is a Linear layer and EAGLE-3 has none (fusion=linear or eagle3)",
        )
    if cfg.fusion_bias:
        raise _refuse(
            where,
            "model.fusion_bias=true:",
            "vLLM's EAGLE fc has no bias; train with drafter.model.fusion_bias=false",
        )
    if cfg.first_input_norm:
        raise _refuse(
            where,
            "model.first_input_norm=true:",
            "vLLM's EAGLE layer 0 has no input norm; "
            "train with drafter.model.first_input_norm=false",
        )
    check_vocab(loaded, full_vocab)


def check_vocab(loaded: LoadedDrafter, full_vocab: bool) -> None:
    cfg, where = loaded.model.cfg, loaded.folder
    if not cfg.draft_vocab_size:
        return
    field = f"model.draft_vocab_size={cfg.draft_vocab_size}"
    if getattr(cfg, "trainable_lm_head", False):
        raise _refuse(
            where,
            f"{field} with model.trainable_lm_head=true:",
            "vLLM loads no draft vocabulary here and the trained head has only those rows",
        )
    if not full_vocab:
        raise _refuse(
            where,
            f"{field}:",
            "vLLM 0.32 loads no draft vocabulary for this drafter (EAGLE-1 has none; Medusa's "
            "token_map fails to load). Train with drafter.model.draft_vocab_size=null, or "
            "export with --full-vocab to let it score every target token (what it proposes "
            "can then differ from what was measured with the draft vocabulary)",
        )


def falcon_tensors(loaded: LoadedDrafter) -> dict:
    m, d = loaded.model, loaded.model.cfg.hidden_size
    w = m.fusion.weight  # (d, 2d) over cat(feature, embedding); vLLM's over cat(embedding, feature)
    out = {"fc.weight": torch.cat([w[:, d:], w[:, :d]], dim=1)}
    for i, layer in enumerate(m.layers):
        p = f"layers.{i}"
        if i > 0:
            out[f"{p}.input_layernorm.weight"] = layer.input_layernorm.weight
        out[f"{p}.post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{p}.self_attn.{name}.weight"] = getattr(layer.self_attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{p}.mlp.{name}.weight"] = getattr(layer.mlp, name).weight
    return out


def eagle3_tensors(loaded: LoadedDrafter, lm_head_weight: torch.Tensor, full_vocab: bool) -> dict:
    """vLLM's EAGLE-3 names: our layers keep theirs (layer 0's q/k/v already read [embedding ;
    feature] columns in vLLM's order), `norm`, and the head: the target's rows of the draft
    vocabulary with `d2t` (draft id + d2t = target id), or every row (no d2t)."""
    m = loaded.model
    out = {f"layers.{k}": v for k, v in m.layers.state_dict().items()}
    out["norm.weight"] = m.norm.weight
    if m.fc is not None:  # EAGLE-3's fused features: a norm per aux layer, then fc
        out["fc.weight"] = m.fc.weight
        out |= {f"fc_norm.{k}": v for k, v in m.fc_norm.state_dict().items()}
    if m.vocab is None or full_vocab:
        out["lm_head.weight"] = lm_head_weight
    else:
        ids = m.vocab.ids.long()
        out["lm_head.weight"] = lm_head_weight[ids]
        out["d2t"] = ids - torch.arange(len(ids))
    return out


def falcon_config(loaded: LoadedDrafter, target_config: dict, full_vocab: bool = False) -> dict:
    """A Llama config for vLLM's EagleLlamaForCausalLM (vLLM wraps it: method "eagle"), or
    with fusion eagle3 for its Eagle3LlamaForCausalLM (method "eagle3")."""
    cfg = loaded.model.cfg
    max_pos = int(target_config.get("max_position_embeddings") or 4096)
    if cfg.fusion == "eagle3":
        vocab = cfg.vocab_size if full_vocab else (cfg.draft_vocab_size or cfg.vocab_size)
        return (
            _llama_config(cfg, max_pos)
            | {
                "architectures": ["LlamaForCausalLMEagle3"],
                "draft_vocab_size": vocab,
                "target_hidden_size": cfg.hidden_size,
                "norm_before_residual": False,
                "norm_output": True,
            }
            | _aux_config(cfg)
        )
    return _llama_config(cfg, max_pos)


def _aux_config(cfg) -> dict:
    if not cfg.aux_layers:
        return {"eagle_config": {"use_aux_hidden_state": False}}
    ids = list(cfg.aux_layers)
    return {
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": ids},
        "eagle_aux_hidden_state_layer_ids": ids,
        "num_aux_hidden_states": len(ids),
        "fc_norm": True,
    }


def speculators_config(config: dict, verifier: str, tokens: int) -> dict:
    """vllm speculators' EAGLE-3 config from our plain EAGLE-3 one (`falcon_config` with aux
    layers): what vLLM's SpeculatorsConfig turns back into the same Llama config."""
    layer = {k: v for k, v in config.items() if k not in EAGLE3_FIELDS}
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer | {"architectures": ["LlamaForCausalLM"]},
        **{k: config[k] for k in EAGLE3_FIELDS if k in config and k not in SPECULATORS_OWN},
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }


SPECULATORS_OWN = ("architectures", "eagle_config")  # replaced, and implied by the format
# the EAGLE-3 keys of `falcon_config` that speculators keeps beside the layer config
EAGLE3_FIELDS = (
    "architectures", "draft_vocab_size", "target_hidden_size", "norm_before_residual",
    "norm_output", "eagle_config", "eagle_aux_hidden_state_layer_ids", "num_aux_hidden_states",
    "fc_norm",
)  # fmt: skip


def _llama_config(cfg, max_pos: int) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        # plain RoPE with the target's theta, as the drafter was trained (FalconConfig)
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    }


def export_vllm(
    drafter: str | Path | LoadedDrafter,
    out: str | Path,
    *,
    target_lm_head: torch.Tensor | None = None,
    target_config: dict | None = None,
    dtype: str | None = None,
    full_vocab: bool = False,
    force: bool = False,
    verifier: str | None = None,
    speculative_tokens: int = 3,
) -> Path:
    """Write `out`, a folder vLLM loads as the speculative model of the drafter's target.

    drafter: our exported folder (or it loaded). target_lm_head: the target's (V, d) LM head
    weight (Medusa without its own head; default: the drafter's target loaded by
    `drafters.target.load_target`). target_config: the target's HF config dict (Falcon: its
    max_position_embeddings; default: read from the target). dtype: of the weights (default:
    the drafter's). verifier: write vllm speculators' format instead, naming this target (hub
    id or folder) and `speculative_tokens` (EAGLE-3 with aux layers only). Written atomically;
    returns `out`.
    """
    loaded = drafter if isinstance(drafter, LoadedDrafter) else load_drafter(drafter)
    where = loaded.folder or "drafter"
    if loaded.kind == "cerberus":
        raise _refuse(
            where,
            "kind=cerberus:",
            "its heads read each other's hidden state (head i after head i-1), which no "
            "engine's Medusa implementation has; export a Medusa drafter instead",
        )
    eagle3 = loaded.kind == "falcon" and loaded.model.cfg.fusion == "eagle3"
    if verifier is not None and not (eagle3 and loaded.model.cfg.aux_layers):
        raise _refuse(
            where,
            "fusion/aux_layers:",
            "vLLM reads speculators' EAGLE-3 config with fused target layers only; train with "
            "drafter.model.fusion=eagle3 and drafter.model.aux_layers, or export with "
            "--format vllm",
        )
    needs_target = (
        (loaded.kind == "medusa" and loaded.model.lm_head is None) or eagle3
    ) and target_lm_head is None
    needs_target |= loaded.kind == "falcon" and target_config is None
    if loaded.kind == "falcon":
        check_falcon(loaded, full_vocab)
    else:
        check_vocab(loaded, full_vocab)
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force) to replace it")
    if needs_target:
        from drafters.target import load_target

        target = load_target(None, identity=loaded.target_identity)
        target_lm_head = target.model.get_output_embeddings().weight.detach()
        target_config = target.model.config.to_dict()
    if loaded.kind == "medusa":
        config, tensors = medusa_config(loaded), medusa_tensors(loaded, target_lm_head)
    elif eagle3:
        config = falcon_config(loaded, target_config, full_vocab)
        tensors = eagle3_tensors(loaded, target_lm_head, full_vocab)
        if verifier is not None:
            config = speculators_config(config, verifier, speculative_tokens)
    else:
        config, tensors = falcon_config(loaded, target_config), falcon_tensors(loaded)

    torch_dtype = DTYPES[dtype or loaded.config.get("weights", {}).get("dtype", "float32")]
    config["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
    if "transformer_layer_config" in config:  # speculators: the layer config is the model's
        config["transformer_layer_config"]["torch_dtype"] = config["torch_dtype"]
    state = {
        k: v.detach()
        .to("cpu", torch_dtype if v.is_floating_point() else v.dtype)
        .contiguous()
        .clone()
        for k, v in tensors.items()
    }
    source = {
        "drafter": str(loaded.folder) if loaded.folder else None,
        "kind": loaded.kind,
        "target": loaded.target_identity,
        "vllm_method": vllm_method(loaded),
        "num_speculative_tokens": (loaded.model.cfg.num_heads if loaded.kind == "medusa" else None),
        "full_vocab": bool(full_vocab and loaded.model.cfg.draft_vocab_size),
        "format": "vllm" if verifier is None else "speculators",
    }
    with staged_dir(out, replace=force) as tmp:
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out
