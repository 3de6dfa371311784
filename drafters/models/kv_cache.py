"""The Falcon drafter's KV cache: explicit per-layer tensors the decoder can prune.

keys[l], values[l]: (B, H_kv, S, head_dim), keys stored after RoPE, S = `length`. A forward
given the cache appends its T new positions to every layer. The decoder keeps what it wants:
`crop(n)` drops everything from position n on, `keep(indices)` retains selected positions
(e.g. prefix + accepted path after a tree step) in the given order.

Without autograd (decoding) the entries live in a preallocated buffer per layer, grown by
doubling: a forward writes its new positions in place and `keys[l]`/`values[l]` are views of the
filled part, so no forward re-copies the cache. With autograd (CSGD's own-block passes in
training) `update` concatenates, since an in-place write would change tensors saved for backward.

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
        self._buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(
        self, layer_idx: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, H_kv, T, hd) to layer `layer_idx`; return all (B, H_kv, S+T, hd)."""
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if torch.is_grad_enabled():
            if old_k is not None:
                k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
            self.keys[layer_idx], self.values[layer_idx] = k, v
            return k, v
        n, t = (0 if old_k is None else old_k.shape[2]), k.shape[2]
        buf = self._buffers[layer_idx]
        if buf is None or n + t > buf[0].shape[2] or not _views_of(old_k, old_v, buf):
            buf = self._grow(layer_idx, k, v, n + t)
        kb, vb = buf
        kb[:, :, n : n + t], vb[:, :, n : n + t] = k, v
        self.keys[layer_idx], self.values[layer_idx] = kb[:, :, : n + t], vb[:, :, : n + t]
        return self.keys[layer_idx], self.values[layer_idx]

    def _grow(self, i: int, k: torch.Tensor, v: torch.Tensor, need: int):
        """A new buffer of twice what is needed, holding layer i's current entries."""
        B, H, _, D = k.shape
        kb = k.new_empty(B, H, max(64, 2 * need), D)
        vb = v.new_empty(B, H, kb.shape[2], v.shape[3])
        old_k, old_v = self.keys[i], self.values[i]
        if old_k is not None and old_k.shape[2]:
            kb[:, :, : old_k.shape[2]], vb[:, :, : old_v.shape[2]] = old_k, old_v
        self._buffers[i] = (kb, vb)
        return kb, vb

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


def _views_of(k: torch.Tensor | None, v: torch.Tensor | None, buf) -> bool:
    """Whether k and v (None: nothing cached yet) are views of the buffers `buf`."""
    if k is None:
        return True
    kb, vb = buf
    return (k.untyped_storage().data_ptr() == kb.untyped_storage().data_ptr()
            and v.untyped_storage().data_ptr() == vb.untyped_storage().data_ptr())  # fmt: skip
