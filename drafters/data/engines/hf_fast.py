"""The fast HF engine: the target's own HF forward on an in-place KV cache of fixed slots.

Where HF `generate` loses its time on this machine (a profile at batch 32: 26% re-copying the
`DynamicCache` every step, 25% attention over left padding, a quarter of all row-steps spent on
rows that had already finished), this engine

- keeps every layer's keys and values in one preallocated (slots, H_kv, max_len, head_dim)
  tensor and writes each step's entry in place;
- keeps the live rows in slots 0..n-1: a finished row's slot is taken by the last live row
  (one row's cache copied) and the next queued request is prefilled into the free slot at once,
  so no row is decoded past its end and the batch stays full while work is queued;
- prefills each new request alone (no padding) and decodes the live rows together with their
  own position ids and a 4D mask over each row's own length.

Same model code as `hf`, so in the same dtype the answers equal `hf`'s (tested); rows may see
different batch companions, so a near-tie could in principle break otherwise.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from drafters.data.engines import Engine, OnDone, Request, SamplingConfig, hf_engine_info
from drafters.target import Target


class SlotCache:
    """Duck-typed HF cache: attention layers call `update(k, v, layer_idx)` and attend to what
    it returns. `prefill(slot)` / `decode(n, lengths)` set where the next forward writes."""

    def __init__(self, num_layers: int, slots: int, heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):  # fmt: skip
        shape = (slots, heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self._slot: int | None = None
        self._lengths: torch.Tensor | None = None

    def prefill(self, slot: int) -> None:
        self._slot, self._lengths = slot, None

    def decode(self, lengths: torch.Tensor) -> None:
        self._slot, self._lengths = None, lengths

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self._lengths is None:  # prefill: (1, H, T, hd) into positions [0, T) of the slot
            s, t = self._slot, key_states.shape[2]
            k[s, :, :t] = key_states[0]
            v[s, :, :t] = value_states[0]
            return k[s : s + 1, :, :t], v[s : s + 1, :, :t]
        n = key_states.shape[0]  # decode: (n, H, 1, hd), row r at position lengths[r]
        rows = torch.arange(n, device=k.device)
        k[rows, :, self._lengths] = key_states[:, :, 0]
        v[rows, :, self._lengths] = value_states[:, :, 0]
        width = int(self._lengths.max()) + 1
        return k[:n, :, :width], v[:n, :, :width]

    def move(self, src: int, dst: int, length: int) -> None:
        for k, v in zip(self.keys, self.values, strict=True):
            k[dst, :, :length] = k[src, :, :length]
            v[dst, :, :length] = v[src, :, :length]


@dataclass
class _Row:
    request: Request
    length: int  # tokens in the cache
    generated: list[int] = field(default_factory=list)  # the last one is not in the cache yet
    generator: torch.Generator | None = None


class SlotEngine(Engine):
    def __init__(self, target: Target, batch_size: int, max_len: int):
        self.target, self.batch_size, self.max_len = target, batch_size, max_len
        self.info = hf_engine_info("hf_fast", target)
        self._cache: SlotCache | None = None

    def _new_cache(self) -> SlotCache:
        c = self.target.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return SlotCache(
            c.num_hidden_layers, self.batch_size, c.num_key_value_heads, self.max_len,
            head_dim, self.target.dtype, self.target.device,
        )  # fmt: skip

    def _forward(self, ids, positions, mask) -> torch.Tensor:
        out = self.target.model.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, cache=self._cache,
            use_cache=True,
        )  # fmt: skip
        return self.target.lm_head(out.last_hidden_state[:, -1]).float()  # (B, V)

    def _pick(self, logits: torch.Tensor, rows: list[_Row], s: SamplingConfig) -> list[int]:
        if not s.do_sample:
            return logits.argmax(-1).tolist()
        probs = torch.softmax(logits / s.temperature, dim=-1)
        if s.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > s.top_p
            probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        return [
            int(torch.multinomial(p, 1, generator=r.generator))
            for p, r in zip(probs, rows, strict=True)
        ]

    @torch.no_grad()
    def run(self, requests: list[Request], sampling: SamplingConfig, on_done: OnDone) -> None:
        if self._cache is None:
            self._cache = self._new_cache()
        cache, device, dtype = self._cache, self.target.device, self.target.dtype
        neg = torch.finfo(dtype).min
        stop = set(sampling.stop_token_ids)
        queue, live = deque(requests), []

        def finished(row: _Row) -> bool:
            return row.generated[-1] in stop or len(row.generated) >= sampling.max_new_tokens

        def finish(row: _Row) -> None:
            finish = "eos" if row.generated[-1] in stop else "length"
            queue.extend(on_done(row.request, row.generated, finish))

        while queue or live:
            while queue and len(live) < self.batch_size:  # refill free slots
                req = queue.popleft()
                t = len(req.prompt)
                if t + sampling.max_new_tokens > self.max_len:
                    raise ValueError(f"request {req.id}: {t} prompt tokens + max_new_tokens "
                                     f"exceed the engine's max_len {self.max_len}")  # fmt: skip
                gen = None
                if sampling.do_sample:
                    gen = torch.Generator(device=device).manual_seed(req.seed)
                row = _Row(req, t, generator=gen)
                cache.prefill(len(live))
                ids = torch.tensor([req.prompt], device=device)
                pos = torch.arange(t, device=device)[None]
                mask = torch.full((t, t), neg, dtype=dtype, device=device).triu(1)[None, None]
                row.generated.append(self._pick(self._forward(ids, pos, mask), [row], sampling)[0])
                if finished(row):
                    finish(row)
                else:
                    live.append(row)
            if not live:
                continue
            n = len(live)
            lengths = torch.tensor([r.length for r in live], device=device)
            width = int(lengths.max()) + 1
            allowed = torch.arange(width, device=device)[None] <= lengths[:, None]
            mask = torch.zeros((n, width), dtype=dtype, device=device)
            mask = mask.masked_fill(~allowed, neg)[:, None, None]  # (n, 1, 1, width)
            ids = torch.tensor([[r.generated[-1]] for r in live], device=device)
            cache.decode(lengths)
            tokens = self._pick(self._forward(ids, lengths[:, None], mask), live, sampling)
            for r, tok in zip(live, tokens, strict=True):
                r.length += 1
                r.generated.append(tok)
            for i in reversed(range(n)):  # free finished slots: the last live row moves in
                if finished(live[i]):
                    row, last = live[i], len(live) - 1
                    if i != last:
                        cache.move(last, i, live[last].length)
                        live[i] = live[last]
                    live.pop()
                    finish(row)
