"""Training examples from a distilled dataset: tokens, loss masks, length-bucketed batches.

One example = one distilled conversation: the target's generated ids verbatim as the assistant
spans, the chat template's tokens around them (`drafters.data.chat.render_conversation`), cut
to `max_length` tokens, loss mask on assistant tokens. Batches are right-padded;
`attention_mask` marks real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, Sampler

from drafters.data.chat import render_conversation


@dataclass(frozen=True)
class Example:
    key: str  # conversation id + content hash (as in the distilled dataset)
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]


class ConversationExamples(Dataset):
    """Rendered, truncated examples. Examples with no assistant token left are dropped and
    counted in `self.dropped` (e.g. a first answer that starts past `max_length`)."""

    def __init__(self, rows: list[dict], tokenizer, max_length: int, eos_token_ids: list[int]):
        self.examples: list[Example] = []
        self.dropped = 0
        for row in rows:
            # a cut answer has no end-of-turn token in its ids, so none is in the loss
            r = render_conversation(tokenizer, row["messages"], eos_token_ids, row["response_ids"])
            ids, mask = r.input_ids[:max_length], r.loss_mask[:max_length]
            if sum(mask) == 0:
                self.dropped += 1
                continue
            self.examples.append(Example(row["key"], tuple(ids), tuple(mask)))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    @property
    def lengths(self) -> list[int]:
        return [len(e.input_ids) for e in self.examples]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def num_answer_tokens(self) -> int:
        return sum(sum(e.loss_mask) for e in self.examples)

    def answer_tokens(self):
        """Per example, the ids of its loss-masked (generated) tokens."""
        for e in self.examples:
            yield [t for t, m in zip(e.input_ids, e.loss_mask, strict=True) if m]

    def subset_by_answer_tokens(self, budget: int, seed: int = 0) -> ConversationExamples:
        """The examples of a seeded random order, taken while their answer tokens total at most
        `budget` (at least one): smaller budgets are prefixes of larger ones with the same seed,
        for data-scaling curves. The offline feature cache serves it by key."""
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self.examples), generator=g).tolist()
        sub = object.__new__(ConversationExamples)
        sub.examples, sub.dropped = [], self.dropped
        total = 0
        for i in order:
            n = sum(self.examples[i].loss_mask)
            if sub.examples and total + n > budget:
                break
            sub.examples.append(self.examples[i])
            total += n
        return sub


def collate(
    examples: list[Example],
    pad_id: int,
    features: list[torch.Tensor] | None = None,
    entropy: list[torch.Tensor] | None = None,
):
    """Right-pad a list of examples. Returns input_ids, attention_mask, loss_mask (B, T) and,
    with an offline cache, features (B, T, d) (zeros on padding) and, when the cache holds it,
    target_entropy (B, T) float32."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    loss = torch.zeros((len(examples), width), dtype=torch.long)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        attn[b, :n] = 1
        loss[b, :n] = torch.tensor(e.loss_mask)
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}
    if features is not None:
        f = torch.zeros((len(examples), width, features[0].shape[-1]), dtype=features[0].dtype)
        for b, x in enumerate(features):
            f[b, : x.shape[0]] = x
        batch["features"] = f
    if entropy is not None:
        h = torch.zeros((len(examples), width), dtype=torch.float32)
        for b, x in enumerate(entropy):
            h[b, : x.shape[0]] = x
        batch["target_entropy"] = h
    return batch


class LengthBucketBatchSampler(Sampler[list[int]]):
    """Deterministic, resumable, rank-sharded batches of similar-length examples.

    Per epoch: shuffle all indices with (seed, epoch), cut into pools of `pool_batches` batches,
    sort each pool by length, cut into batches, shuffle the batch order. Every rank sees the same
    global batch order and takes batches rank, rank + world, ... (the tail that does not fill
    all ranks is dropped so ranks stay in step). `start_batch` skips batches already trained in
    the resumed epoch, so a restart continues with exactly the batch it would have seen next.
    """

    def __init__(
        self,
        lengths: list[int],
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        pool_batches: int = 64,
    ):
        self.lengths = lengths
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank, self.world_size = rank, world_size
        self.pool_batches = pool_batches
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int) -> None:
        # Lightning calls this at every epoch start; a skip only applies to the resumed epoch.
        if epoch != self.epoch:
            self.start_batch = 0
        self.epoch = epoch

    def global_batches(self) -> list[list[int]]:
        n = len(self.lengths)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(n, generator=g).tolist() if self.shuffle else list(range(n))
        pool = self.batch_size * self.pool_batches
        batches = []
        for i in range(0, n, pool):
            chunk = sorted(order[i : i + pool], key=lambda j: self.lengths[j])
            batches += [
                chunk[k : k + self.batch_size] for k in range(0, len(chunk), self.batch_size)
            ]
        if self.shuffle:
            perm = torch.randperm(len(batches), generator=g).tolist()
            batches = [batches[p] for p in perm]
        usable = len(batches) // self.world_size * self.world_size
        return batches[:usable]

    def __iter__(self):
        mine = self.global_batches()[self.rank :: self.world_size]
        yield from mine[self.start_batch :]

    def __len__(self) -> int:
        return max(0, len(self.global_batches()) // self.world_size - self.start_batch)
