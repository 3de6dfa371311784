"""The reference engine: HF `generate` on left-padded batches of `batch_size` requests.

Requests are taken in queue order (the caller sorts them by length, so padding is small);
follow-ups join the back of the queue. Every row is decoded until the longest row of its batch
ends: simple and the most widely checked path, the yardstick of `hf_fast` and `vllm`.
"""

from __future__ import annotations

from collections import deque

import torch

from drafters.data.engines import Engine, OnDone, Request, SamplingConfig, hf_engine_info
from drafters.target import Target


def cut_at_stop(row: list[int], stop: set[int]) -> tuple[list[int], str]:
    """A generated row up to and including its first stop token: (ids, "eos"), or the row
    unchanged with "length" when it never stopped."""
    for i, t in enumerate(row):
        if t in stop:
            return row[: i + 1], "eos"
    return row, "length"


class HFGenerateEngine(Engine):
    def __init__(self, target: Target, batch_size: int):
        self.target, self.batch_size = target, batch_size
        self.info = hf_engine_info("hf", target)

    @torch.no_grad()
    def run(self, requests: list[Request], sampling: SamplingConfig, on_done: OnDone) -> None:
        queue = deque(requests)
        pad = self.target.tokenizer.pad_token_id
        stop = set(sampling.stop_token_ids)
        while queue:
            batch = [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]
            width = max(len(r.prompt) for r in batch)
            ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in batch])
            attn = torch.tensor(
                [[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in batch]
            )
            kwargs = dict(
                do_sample=sampling.do_sample,
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=pad,
                eos_token_id=sorted(stop),
            )
            if sampling.do_sample:
                kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
                torch.manual_seed(batch[0].seed)
            else:
                kwargs.update(temperature=None, top_p=None, top_k=None)
            device = self.target.device
            out = self.target.model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), **kwargs
            )
            for r, row in zip(batch, out[:, width:].tolist(), strict=True):
                answer, finish = cut_at_stop(row, stop)
                queue.extend(on_done(r, answer, finish))
