"""A Llama decoder layer (RMSNorm, RoPE, GQA attention, SwiGLU), written out in plain torch.

The Falcon drafter's body. Own code rather than transformers' so that the mask and the KV cache
are exactly what the drafter and the decoder pass in. Numerics follow HF Llama: RMSNorm in
float32, rotate-half RoPE with inv_freq = theta^(-2i/head_dim), no biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids (B, T) -> cos, sin (B, 1, T, head_dim), broadcast over attention heads."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=position_ids.device).float() / head_dim)
    )
    freqs = position_ids.float().unsqueeze(-1) * inv_freq  # (B, T, head_dim / 2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (B, T, head_dim)
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, hd) rotated by position: x * cos + rotate_half(x) * sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        input_size: int | None = None,
    ):
        """input_size: width of what q, k and v read (default hidden_size; EAGLE-3's first
        layer reads 2 * hidden_size); o_proj always writes hidden_size."""
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of {num_kv_heads=}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        n_in = input_size or hidden_size
        self.q_proj = nn.Linear(n_in, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(n_in, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(n_in, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache=None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """x (B, T, d); mask (B|1, 1, T, S) bool (True = attend) or additive float, S = past + T.

        `cache` (a `FalconKVCache`) receives this call's keys (after RoPE) and values and returns
        the full (B, H_kv, S, hd) tensors.
        """
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (B, H, T, hd), (B, Hkv, T, hd)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)  # (B, Hkv, S, hd)
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:  # GQA: each kv head serves `rep` query heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Llama layer: x + Attn(norm(x)), then + MLP(norm(.)).

    input_norm=False: x + Attn(x) (EAGLE's first drafter layer, whose input is the fusion's)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        intermediate_size: int,
        eps: float,
        input_norm: bool = True,
    ):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps) if input_norm else nn.Identity()
        self.self_attn = Attention(hidden_size, num_heads, num_kv_heads, head_dim)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x, cos, sin, mask, cache=None, layer_idx: int = 0) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer_idx)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3FirstLayer(DecoderLayer):
    """EAGLE-3's first drafter layer, as vLLM runs it (`llama_eagle3.py`, plain format with
    `norm_before_residual: false`): no fusion Linear; the attention reads both inputs, each
    normalised, and the residual stream starts at the raw feature.

        a = norm_in(emb(t_{j+1})),  b = norm_hidden(f_j)
        x = f_j + Attn(q, k, v over [a ; b])        (2d wide, embedding first)
        x = x + MLP(norm_post(x))

    forward takes (B, T, 2d) = [f ; emb] (the Falcon drafter's input order). Same arguments as
    `DecoderLayer` (its input norm is the embedding's)."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, *args, **kw):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, *args, **kw)
        self.hidden_norm = RMSNorm(hidden_size, self.post_attention_layernorm.eps)
        self.self_attn = Attention(hidden_size, num_heads, num_kv_heads, head_dim, 2 * hidden_size)

    def forward(self, x, cos, sin, mask, cache=None, layer_idx: int = 0) -> torch.Tensor:
        f, e = x.chunk(2, dim=-1)
        u = torch.cat([self.input_layernorm(e), self.hidden_norm(f)], dim=-1)
        x = f + self.self_attn(u, cos, sin, mask, cache, layer_idx)
        return x + self.mlp(self.post_attention_layernorm(x))


def layer_num_params(
    hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int
) -> int:
    """d*hd*(2H + 2H_kv) attention + 3*d*I SwiGLU + 2d norms."""
    d = hidden_size
    return d * head_dim * (2 * num_heads + 2 * num_kv_heads) + 3 * d * intermediate_size + 2 * d
