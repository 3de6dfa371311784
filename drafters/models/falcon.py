"""Falcon drafter (docs/design.md section 4): semi-autoregressive, k tokens per forward.

Position j reads the pair (f_j, emb(t_{j+1})), fuses it 2d -> d (Linear as EAGLE, or an LSTM
with a real recurrence over T), runs two Llama decoder layers under the relaxed mask and outputs
a feature (no final norm). `fusion="eagle3"` is EAGLE-3's layout instead: no fusion layer, the
first decoder layer's attention reads [norm(emb) ; norm(f)] and its residual starts at f
(`llama.Eagle3FirstLayer`), and a final RMSNorm closes the stack; vLLM serves it, draft
vocabulary included (drafters/export/vllm.py). With `aux_layers` (eagle3 only) it also reads
EAGLE-3's fused features: the target's hidden states entering those layers, each RMS-normed,
concatenated and projected to d by `fc`, take f_j's place as the true input (`inputs`); the
targets stay f. Position j is trained to output f_{j+k}; the
caller's frozen LM head turns it into the distribution of t_{j+k+1}. So the block (f1,t2),
(f2,t3) predicts (f3,f4) and (t4,t5).

Relaxed (block-causal) mask, k = 2, blocks aligned at absolute position 0 (1 = may attend):

    q\\kv  0 1 2 3 4 5
      0   1 1 . . . .
      1   1 1 . . . .
      2   1 1 1 1 . .
      3   1 1 1 1 . .
      4   1 1 1 1 1 1
      5   1 1 1 1 1 1

Inside `FalconDrafter.forward` blocks are counted on the position ids (default: count of real
tokens before the position), so a left-padded row gets the blocks of the same row unpadded.
The target's embedding and LM head are arguments, never submodules; with a draft vocabulary
(`draft_vocab_size`) the outputs are scored against its rows of the LM head only
(`scoring_head`).

In-block assignment (`assignment`, docs/design.md section 4). "paper": slot q of a block (q = 0
.. k-1) predicts offset q + 1 after the block's last known token, i.e. output j approximates
f_{j+k}. Depth 1 then comes from the first slot, which reaches the freshest pair (the last
slot's) only by attending forward inside its block. "reversed": slot q predicts offset k - q, so
the last slot, holding the freshest pair, predicts depth 1. The forward returns its outputs in
offset order either way (output j always stands for f_{j+k}), so losses and decoders never see
the assignment: reversed reorders each block's outputs, `slots` telling where the blocks are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from drafters.models.kv_cache import FalconKVCache
from drafters.models.llama import (
    DecoderLayer,
    Eagle3FirstLayer,
    RMSNorm,
    layer_num_params,
    rope_cos_sin,
)
from drafters.models.vocab import DraftVocab, output_head

__all__ = [
    "FalconConfig",
    "FalconDrafter",
    "FalconKVCache",
    "block_causal_mask",
    "reverse_in_blocks",
]


FUSIONS = ("linear", "lstm", "eagle3")


@dataclass(frozen=True)
class FalconConfig:
    hidden_size: int  # d, the target's hidden size
    vocab_size: int  # V, the target's vocabulary (the LM head is the target's)
    k: int = 2  # tokens per drafter forward (block size of the relaxed mask)
    num_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int | None = None  # None: num_attention_heads (no GQA)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_size: int | None = None  # None: 8d/3 rounded up to a multiple of 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    # "linear" (EAGLE), "lstm" (paper's figure, batch_first) or "eagle3" (EAGLE-3's first layer
    # and final norm, no fusion layer; fusion_bias and first_input_norm do not apply)
    fusion: str = "linear"
    draft_vocab_size: int | None = None  # V_d: score only these target ids (models/vocab.py)
    assignment: str = "paper"  # in-block slot -> offset: "paper" (q -> q+1) or "reversed"
    # EAGLE's layout (and so vLLM's EAGLE drafter, drafters/export/vllm.py) has no bias in the
    # fusion and no input norm in layer 0: both false make a k=1 Falcon exportable there.
    fusion_bias: bool = True  # the linear fusion's bias (ignored by the LSTM fusion)
    first_input_norm: bool = True  # layer 0 normalises its input (EAGLE: false)
    # eagle3 only: target layers whose input hidden states (pre-norm residual stream, as vLLM's
    # aux hidden states) are fused into the true input feature, EAGLE-3's low/mid/high
    # features; None: the last hidden state f itself
    aux_layers: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, not {self.fusion!r}")
        if self.assignment not in ("paper", "reversed"):
            raise ValueError(f"assignment must be 'paper' or 'reversed', not {self.assignment!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, not {self.k}")
        if self.aux_layers is not None:
            if self.fusion != "eagle3" or not self.aux_layers:
                raise ValueError(
                    f"aux_layers={self.aux_layers!r} needs fusion='eagle3' and at least one "
                    f"layer (fusion={self.fusion!r}); set drafter.model.aux_layers=null otherwise"
                )
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.intermediate_size is None:
            inter = 256 * math.ceil(8 * self.hidden_size / 3 / 256)
            object.__setattr__(self, "intermediate_size", inter)

    @classmethod
    def from_target_config(cls, hf_config, **overrides) -> FalconConfig:
        """Layer shapes of the target (HF Llama-family config); `overrides` win.

        RoPE scaling of the target (e.g. Llama-3 `rope_type`) is not reproduced: the drafter
        uses plain RoPE with the target's theta.
        """
        rope = getattr(hf_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0
        heads = hf_config.num_attention_heads
        kw = dict(
            hidden_size=hf_config.hidden_size,
            vocab_size=hf_config.vocab_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            intermediate_size=hf_config.intermediate_size,
            rope_theta=float(theta),
            rms_norm_eps=getattr(hf_config, "rms_norm_eps", 1e-6),
        )
        kw.update(overrides)
        return cls(**kw)

    def num_params(self) -> int:
        """fusion + L * layer, with
        fusion = 2d^2 + d (Linear 2d -> d with bias; 2d^2 without) or 12d^2 + 8d (LSTM 2d -> d,
        two biases); layer = d*hd*(2H + 2H_kv) + 3*d*I + 2d (q,k,v,o; SwiGLU; two RMSNorms; d
        less for layer 0 without its input norm). eagle3: no fusion; layer 0's q, k, v read 2d
        (+ d*hd*(H + 2H_kv)) and it has a third norm (+ d), and a final norm (+ d); with n
        aux_layers, n norms and fc (n*d -> d, no bias): + n*d + n*d^2."""
        d, hd = self.hidden_size, self.head_dim
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        layer = layer_num_params(d, heads, kv, hd, self.intermediate_size)
        if self.fusion == "eagle3":
            n = len(self.aux_layers or ())
            return self.num_layers * layer + d * hd * (heads + 2 * kv) + 2 * d + n * d * (d + 1)
        if self.fusion == "linear":
            fusion = 2 * d * d + (d if self.fusion_bias else 0)
        else:
            fusion = 12 * d * d + 8 * d
        return fusion + self.num_layers * layer - (0 if self.first_input_norm else d)


def num_params(cfg: FalconConfig) -> int:
    """See `FalconConfig.num_params`: fusion + L * (d*hd*(2H + 2H_kv) + 3dI + 2d)."""
    return cfg.num_params()


def block_causal_mask(
    T: int, k: int, past_len: int = 0, device: torch.device | str | None = None
) -> torch.Tensor:
    """Bool (T, past_len + T), True = may attend, for T new positions after `past_len` cached.

    New row q is absolute position past_len + q; it sees absolute key p iff p // k <= (past_len
    + q) // k: every cached position, its own aligned block (both directions) and earlier
    blocks. k = 1 is the causal mask.
    """
    q = torch.arange(past_len, past_len + T, device=device) // k
    kv = torch.arange(past_len + T, device=device) // k
    return kv.unsqueeze(0) <= q.unsqueeze(1)


def reverse_in_blocks(x: torch.Tensor, k: int, slots: torch.Tensor | None) -> torch.Tensor:
    """Reorder outputs (B, T, d) inside blocks of k: y[j] = x[j + k - 1 - 2 * slot_j], so the
    block's last slot lands on offset 1. slots (B|1, T) in 0 .. k-1; None: consecutive chunks of
    k from position 0. A block cut by the sequence's end reads clamped positions: its outputs
    have no labels inside the sequence (position j is trained on t_{j+k+1})."""
    B, T, _ = x.shape
    if slots is None:
        slots = (torch.arange(T, device=x.device) % k).unsqueeze(0)
    j = torch.arange(T, device=x.device).unsqueeze(0)
    src = (j + k - 1 - 2 * slots.to(x.device)).clamp(0, T - 1).expand(B, T)
    return x.gather(1, src.unsqueeze(-1).expand_as(x))


def _position_ids(attention_mask, B: int, T: int, past: int, device) -> torch.Tensor:
    if attention_mask is None:
        return (past + torch.arange(T, device=device)).expand(B, T)
    return past + (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)


class FalconDrafter(nn.Module):
    def __init__(self, cfg: FalconConfig):
        super().__init__()
        self.cfg = cfg
        self.k = cfg.k
        d = cfg.hidden_size
        size = cfg.draft_vocab_size
        self.vocab = DraftVocab(cfg.vocab_size, size) if size else None
        shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        shape += (cfg.intermediate_size, cfg.rms_norm_eps)
        eagle3 = cfg.fusion == "eagle3"
        if cfg.fusion == "linear":
            self.fusion = nn.Linear(2 * d, d, bias=cfg.fusion_bias)
        elif cfg.fusion == "lstm":
            self.fusion = nn.LSTM(2 * d, d, batch_first=True)
        else:
            self.fusion = None  # layer 0 reads both inputs
        self.layers = nn.ModuleList(
            Eagle3FirstLayer(d, *shape)
            if eagle3 and i == 0
            else DecoderLayer(d, *shape, input_norm=eagle3 or cfg.first_input_norm or i > 0)
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(d, cfg.rms_norm_eps) if eagle3 else None
        n_aux = len(cfg.aux_layers or ())
        self.fc_norm = nn.ModuleList(RMSNorm(d, cfg.rms_norm_eps) for _ in range(n_aux))
        self.fc = nn.Linear(n_aux * d, d, bias=False) if n_aux else None

    def inputs(self, features: torch.Tensor) -> torch.Tensor:
        """The input feature stream (B, T, d). Without aux_layers: `features` as given. With
        them, true positions come wide, [f ; h_a ; h_b ; ...] (B, T, (1 + n) d) as
        `Target.features(aux_layers=...)` makes them, and become fc([norm_i(h_i)]); the
        drafter's own outputs (width d) pass as they are."""
        d = self.cfg.hidden_size
        if self.fc is None or features.shape[-1] == d:
            return features
        n = len(self.fc_norm)
        if features.shape[-1] != (1 + n) * d:
            raise ValueError(
                f"features of width {features.shape[-1]}: this drafter fuses target layers "
                f"{self.cfg.aux_layers}, so true features come {(1 + n) * d} wide ([f ; h_i], "
                f"Target.features(aux_layers=...)) and its own outputs {d} wide"
            )
        aux = features[..., d:].to(self.fc.weight.dtype).chunk(n, dim=-1)
        return self.fc(
            torch.cat([norm(h) for norm, h in zip(self.fc_norm, aux, strict=True)], dim=-1)
        )

    def scoring_head(self, lm_head: nn.Linear) -> nn.Linear:
        """The head that turns output features into draft logits: the target's `lm_head`, or
        its draft-vocabulary rows (logit j = target token `self.vocab.ids[j]`)."""
        return output_head(self.vocab, lm_head)

    def new_cache(self) -> FalconKVCache:
        return FalconKVCache(self.cfg.num_layers)

    def forward(
        self,
        features: torch.Tensor,
        next_tokens: torch.Tensor,
        embed: nn.Embedding,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: FalconKVCache | None = None,
        attn_bias: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predicted features (B, T, d): output j approximates f_{j+k}; logits = lm_head(out).

        features (B, T, d): f_j at position j (true, or the drafter's own in later passes);
            with aux_layers, true ones come wide (`inputs`).
        next_tokens (B, T): t_{j+1} at position j. embed: the target's frozen embedding.
        attention_mask (B, T): 1 = real token (left or right padding; LSTM fusion: right only).
        position_ids (B, T): default past_len + (real tokens before j); RoPE and blocks use them.
        cache: appended to in place (see `FalconKVCache`). Without `attn_bias`, new positions
            see every cached position plus the block-causal pattern among themselves.
        attn_bias (B|1, 1, T, past_len + T): bool (True = attend) or additive float; replaces
            the block-causal and padding masks entirely (the decoder's tree masks).
        slots (B|1, T): each position's slot 0 .. k-1 in its block, read by the reversed
            assignment only; default position_ids % k, or (with attn_bias) consecutive chunks of
            k new positions.
        """
        features = self.inputs(features)
        B, T, _ = features.shape
        past = cache.length if cache is not None else 0
        dtype = self.layers[0].post_attention_layernorm.weight.dtype
        x = torch.cat([features, embed(next_tokens).to(features.dtype)], dim=-1).to(dtype)
        if self.fusion is not None:
            x = self._fuse(x, attention_mask, cache, tree=attn_bias is not None)  # (B, T, d)
        if position_ids is None:
            position_ids = _position_ids(attention_mask, B, T, past, x.device)
        if attn_bias is None:
            mask = self._block_mask(position_ids, attention_mask, past)
        else:
            mask = attn_bias.to(x.device)
        cos, sin = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
        if self.norm is not None:
            x = self.norm(x)
        if self.cfg.assignment == "reversed" and self.k > 1:
            if slots is None:
                slots = position_ids % self.k if attn_bias is None else None
            x = reverse_in_blocks(x, self.k, slots)
        return x

    def fusion_state(
        self,
        features: torch.Tensor,
        next_tokens: torch.Tensor,
        embed: nn.Embedding,
        state: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTM fusion only: its (h, c) after reading these inputs (1, n, .) from `state`
        (no attention runs), for the decoder's realigned block (decoding/falcon.py)."""
        dtype = next(self.fusion.parameters()).dtype
        x = torch.cat([features, embed(next_tokens).to(features.dtype)], dim=-1).to(dtype)
        return self.fusion(x, state)[1]

    def _block_mask(self, position_ids, attention_mask, past: int) -> torch.Tensor:
        """(B, 1, T, past + T) bool: cache visible, blocks of k on position ids, padded keys
        hidden; the diagonal is always open so padded rows stay finite."""
        B, T = position_ids.shape
        blk = position_ids // self.k  # (B, T)
        m = blk.unsqueeze(1) <= blk.unsqueeze(2)  # (B, Tq, Tk): key block <= query block
        if attention_mask is not None:
            m = m & attention_mask.bool().unsqueeze(1)
        m = m | torch.eye(T, dtype=torch.bool, device=m.device)
        if past:
            m = torch.cat([m.new_ones(B, T, past), m], dim=-1)
        return m.unsqueeze(1)

    def _fuse(self, x, attention_mask, cache, tree: bool) -> torch.Tensor:
        """(B, T, 2d) -> (B, T, d). LSTM: a true recurrence over T (batch_first).

        With a cache, a chain forward continues from `cache.lstm_state` and stores its final
        state; a tree forward (attn_bias given) restarts the recurrence from `cache.lstm_state`
        for every consecutive chunk of k new positions (one block of k per expanded node), which
        is exact for the block itself and ignores the recurrence through ancestor blocks (they
        are still seen through attention).
        """
        if isinstance(self.fusion, nn.Linear):
            return self.fusion(x)
        B, T, _ = x.shape
        if cache is None:
            if (
                attention_mask is not None
                and (attention_mask[:, 1:] > attention_mask[:, :-1]).any()
            ):
                raise ValueError("LSTM fusion needs right padding (its recurrence runs over pads)")
            return self.fusion(x)[0]
        past, state = cache.length, cache.lstm_state
        if not tree:
            if past and (state is None or cache.lstm_length != past):
                raise ValueError(
                    f"LSTM fusion: the cache holds {past} positions but its recurrent state is "
                    f"for {cache.lstm_length}; crop it to the last chain forward first"
                )
            out, cache.lstm_state = self.fusion(x, state)
            cache.lstm_length = past + T
            return out
        c = self.k if T % self.k == 0 else T
        if state is not None:
            state = tuple(s.repeat_interleave(T // c, dim=1) for s in state)
        return self.fusion(x.reshape(B * T // c, c, -1), state)[0].reshape(B, T, -1)
