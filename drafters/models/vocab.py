"""The draft vocabulary (docs/design.md section 10): drafters score a frequency-ranked subset of the
target's vocabulary, as FR-Spec and EAGLE-3 do.

A drafter with `draft_vocab_size = V_d` owns a `DraftVocab`: the V_d target token ids it can
propose (`ids`, a buffer, so it travels in checkpoints and exported drafters), most frequent
first. Its logits are over those rows of the target's frozen LM head only (`head`); draft index
i stands for target token `ids[i]` (`to_target`). The target still verifies every drafted token
with its full head, so the decoders stay lossless whatever V_d is; a token outside the draft
vocabulary is simply never proposed (the target emits it as its bonus token).

`top_ids` builds the vocabulary from token counts (`token_counts`, over the tokens the drafter
learns to predict: the target's generated answers).
"""

from __future__ import annotations

import torch
from torch import nn


def token_counts(sequences, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) int64 occurrence counts of the token ids in `sequences` (iterables of ids)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in sequences:
        t = torch.as_tensor(list(ids), dtype=torch.long)
        if t.numel():
            if int(t.max()) >= vocab_size or int(t.min()) < 0:
                raise ValueError(f"token id {int(t.max())} outside the vocabulary ({vocab_size})")
            counts += torch.bincount(t, minlength=vocab_size)
    return counts


def top_ids(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent ids (ties: smaller id first), most frequent first: (size,) long.
    Ids never seen fill the tail in id order, so any size up to the vocabulary works."""
    if not 0 < size <= counts.numel():
        raise ValueError(f"draft vocabulary size {size} must be in 1..{counts.numel()}")
    ids = torch.arange(counts.numel())
    order = torch.argsort(-counts * counts.numel() + ids)  # count descending, then id ascending
    return order[:size].clone()


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of the counted tokens that lie in the vocabulary `ids`."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 1.0


class DraftVocab(nn.Module):
    """V_d target ids (`ids` buffer); the sliced LM head and the id maps in both directions.

    Until `set_ids`, ids = 0 .. V_d - 1 (a placeholder a training run replaces before its first
    step; a checkpoint or exported drafter restores the real ones with the state dict)."""

    def __init__(self, vocab_size: int, size: int):
        super().__init__()
        if not 0 < size <= vocab_size:
            raise ValueError(f"draft_vocab_size={size} must be in 1..vocab_size ({vocab_size})")
        self.vocab_size, self.size = vocab_size, size
        self.register_buffer("ids", torch.arange(size, dtype=torch.long))
        self._memo: dict = {}  # plain dict: never registered as a submodule or buffer

    @torch.no_grad()
    def set_ids(self, ids: torch.Tensor) -> None:
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() != self.size:
            raise ValueError(f"{ids.numel()} ids for a draft vocabulary of {self.size}")
        if (
            ids.unique().numel() != ids.numel()
            or int(ids.min()) < 0
            or int(ids.max()) >= self.vocab_size
        ):
            raise ValueError(f"draft ids must be distinct target ids in 0..{self.vocab_size - 1}")
        self.ids.copy_(ids.to(self.ids.device))
        self._memo.clear()

    def _key(self, *extra):
        return (self.ids.data_ptr(), self.ids._version, self.ids.device, *extra)

    def head(self, lm_head: nn.Linear) -> nn.Linear:
        """A frozen Linear over the V_d rows of `lm_head` (copied once, then reused while the
        head's weight and these ids are unchanged)."""
        w = lm_head.weight
        key = self._key(w.data_ptr(), w._version, w.device, w.dtype)
        hit = self._memo.get("head")
        if hit is None or hit[0] != key:
            sub = nn.Linear(w.shape[1], self.size, bias=lm_head.bias is not None)
            sub = sub.to(device=w.device, dtype=w.dtype).requires_grad_(False)
            with torch.no_grad():
                ids = self.ids.to(w.device)
                sub.weight.copy_(w.detach().index_select(0, ids))
                if lm_head.bias is not None:
                    sub.bias.copy_(lm_head.bias.detach().index_select(0, ids))
            hit = (key, sub)
            self._memo["head"] = hit
        return hit[1]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft indices (any shape) -> target token ids."""
        return self.ids[draft_ids.to(self.ids.device)].to(draft_ids.device)

    def lookup(self) -> torch.Tensor:
        """(vocab_size,) long: target id -> draft index, -1 outside the draft vocabulary."""
        key = self._key()
        hit = self._memo.get("lookup")
        if hit is None or hit[0] != key:
            t2d = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.ids.device)
            t2d[self.ids] = torch.arange(self.size, device=self.ids.device)
            hit = (key, t2d)
            self._memo["lookup"] = hit
        return hit[1]

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape) -> draft indices, -1 where the id is not in the vocabulary."""
        return self.lookup()[target_ids.to(self.ids.device)].to(target_ids.device)

    def extra_repr(self) -> str:
        return f"size={self.size}, vocab_size={self.vocab_size}"


def output_head(vocab: DraftVocab | None, lm_head: nn.Linear) -> nn.Linear:
    """The head a drafter scores with: the draft vocabulary's rows, or the whole target head."""
    return lm_head if vocab is None else vocab.head(lm_head)


def to_target(vocab: DraftVocab | None, draft_ids: torch.Tensor) -> torch.Tensor:
    """Draft indices -> target ids (the identity without a draft vocabulary)."""
    return draft_ids if vocab is None else vocab.to_target(draft_ids)
