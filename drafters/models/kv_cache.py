"""The Falcon drafter's KV cache: explicit per-layer tensors the decoder can prune.

keys[l], values[l]: (B, H_kv, S, head_dim), keys stored after RoPE, S = `length`. A forward
given the cache appends its T new positions to every layer. The decoder keeps what it wants:
`crop(n)` drops everything from position n on, `keep(indices)` retains selected positions
(e.g. prefix + accepted path after a tree step) in the given order.

LSTM fusion only: `lstm_state` = (h, c), each (1, B, d), is the recurrent state after cache
position `lstm_length - 1`. Only chain forwards (`attn_bias=None`) write it; a chain forward
continues the recurrence from it and therefore requires `length == lstm_length` (crop back to
the last chain forward before the next one). Tree forwards read it without writing it.
`crop`/`keep` do not touch it.
"""

from __future__ import annotations

import torch


class FalconKVCache:
    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lstm_state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.lstm_length = 0

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(
        self, layer_idx: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, H_kv, T, hd) to layer `layer_idx`; return all (B, H_kv, S+T, hd)."""
        if self.keys[layer_idx] is not None:
            k = torch.cat([self.keys[layer_idx], k], dim=2)
            v = torch.cat([self.values[layer_idx], v], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v

    def keep(self, indices: torch.Tensor) -> None:
        """Retain positions `indices` along time: LongTensor (S',) for the whole batch, or
        (B, S') per row. Order is kept as given (pass increasing indices to keep positions in
        sequence order)."""
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is None:
                continue
            idx = indices.to(k.device)
            if idx.dim() == 1:
                self.keys[i], self.values[i] = k.index_select(2, idx), v.index_select(2, idx)
            else:
                g = idx[:, None, :, None].expand(k.shape[0], k.shape[1], -1, k.shape[3])
                self.keys[i], self.values[i] = k.gather(2, g), v.gather(2, g)

    def crop(self, n: int) -> None:
        """Keep the first n positions."""
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is not None:
                self.keys[i], self.values[i] = k[:, :, :n], v[:, :, :n]
