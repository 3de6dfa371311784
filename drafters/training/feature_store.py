"""The offline feature cache on disk: its layout, its index, and the read side every run uses.

Layout of a cache folder:

    meta.json            target identity, dtype, hidden size, totals
    shard-000000.npy     (tokens, d) features f_j of a run of consecutive examples
    shard-000000.json    [key, token count, token digest] of those examples, in order
    shard-000000.entropy.npy  (tokens,) float32 entropy H(p_j) of the target's distribution
    shard-000000.aux.npy (tokens, n * d) with aux_layers: the hidden states entering those
                         target layers (EAGLE-3's fused features, `drafters.target.with_aux`)
    ...

A shard is complete once its index (.json) is written, which a build does last. An example is
found by its key (conversation id + content hash) and its tokens checked (count and digest: the
answers are the target's). `drafters.training.feature_cache` builds it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from drafters.target import Target
from drafters.training.examples import ConversationExamples

DTYPES = {
    "bfloat16": (torch.bfloat16, np.uint16),
    "float16": (torch.float16, np.float16),
    "float32": (torch.float32, np.float32),
}


class FeatureCacheError(RuntimeError):
    pass


def shards(folder: Path) -> dict[int, Path]:
    """Complete shards (features and index both written; the index goes last): number -> index
    file."""
    out = {}
    for idx in folder.glob("shard-*.json"):
        if idx.with_suffix(".npy").exists():
            out[int(idx.stem.split("-")[1])] = idx
    return dict(sorted(out.items()))


def tokens_digest(input_ids) -> str:
    """Hash of an example's token ids: the key names the source conversation, this its
    rendering with the target's own answers (which another distillation run may change)."""
    return hashlib.sha256(np.asarray(input_ids, dtype=np.int32).tobytes()).hexdigest()[:16]


def read_index(folder: Path) -> dict[str, tuple]:
    """key -> (shard number, offset, length, tokens digest) over the complete shards."""
    index = {}
    for s, idx in shards(folder).items():
        offset = 0
        for entry in json.loads(idx.read_text()):
            if len(entry) != 3:  # [key, length]: written before the digest, so unverifiable
                raise FeatureCacheError(
                    f"feature cache {folder} was written by an older drafters (no token digests "
                    f"in {idx.name}), so its examples cannot be checked; delete the folder and "
                    "run `python data/cache_features.py` again"
                )
            key, length, digest = entry
            index[key] = (s, offset, length, digest)
            offset += length
    return index


def check_cached_aux(folder: Path, cached, wanted) -> None:
    if cached and wanted and list(cached) != list(wanted):
        raise FeatureCacheError(
            f"feature cache {folder} holds aux layers {list(cached)}, not {list(wanted)}; delete "
            f"its shard-*.aux.npy files (and aux_layers in meta.json) or choose another "
            "data.cache_dir"
        )


def aux_path(index_file: Path) -> Path:
    return index_file.with_suffix(".aux.npy")


def other_examples(folder: Path, examples, index) -> list[str]:
    """Keys cached with other tokens: the same conversation with other answers, or rendered or
    cut otherwise."""
    out = []
    for e in examples:
        if e.key in index:
            _, _, length, digest = index[e.key]
            if length != len(e.input_ids) or digest != tokens_digest(e.input_ids):
                out.append(e.key)
    return out


class FeatureCache:
    """Read side: `cache[key]` -> (L, d) features of one example, memory-mapped from disk. Every
    example must be cached, with its own token count (else: rebuild or extend the cache)."""

    def __init__(
        self,
        folder: str | Path,
        target: Target,
        examples: ConversationExamples,
        aux_layers: tuple[int, ...] | None = None,
    ):
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.exists():
            raise FeatureCacheError(
                f"no feature cache at {self.folder}; build it with "
                "`python data/cache_features.py` (same overrides as for train.py)"
            )
        meta = json.loads(meta_path.read_text())
        problem = target.identity.mismatch(meta["target"], f"feature cache {self.folder}")
        if problem:
            raise FeatureCacheError(problem + "; rebuild it with `python data/cache_features.py`")
        self.meta = meta
        self.torch_dtype = DTYPES[meta["dtype"]][0]
        self.index = read_index(self.folder)  # key -> (shard, offset, length)
        changed = other_examples(self.folder, examples, self.index)
        if changed:
            raise FeatureCacheError(
                f"feature cache {self.folder} was built from other examples ({len(changed)} "
                "cached with other tokens: another corpus, or data.max_length changed); "
                "rebuild it with `python data/cache_features.py` into another data.cache_dir"
            )
        missing = sum(e.key not in self.index for e in examples)
        if missing:
            raise FeatureCacheError(
                f"feature cache {self.folder} lacks {missing} of these {len(examples)} examples "
                "(unfinished, built for a smaller data.max_train_tokens, or the corpus grew); "
                "`python data/cache_features.py` with this run's overrides adds them"
            )
        self.aux_layers = tuple(aux_layers) if aux_layers else None
        self.shards: dict[int, np.ndarray] = {}
        self.entropy_shards: dict[int, np.ndarray | None] = {}
        self.aux_shards: dict[int, np.ndarray] = {}
        for s, idx in shards(self.folder).items():
            self.shards[s] = np.load(idx.with_suffix(".npy"), mmap_mode="r")
            ent = idx.with_suffix(".entropy.npy")
            self.entropy_shards[s] = np.load(ent, mmap_mode="r") if ent.exists() else None
            if self.aux_layers and aux_path(idx).exists():
                self.aux_shards[s] = np.load(aux_path(idx), mmap_mode="r")
        if self.aux_layers:
            check_cached_aux(self.folder, meta.get("aux_layers"), self.aux_layers)
            lacking = {self.index[e.key][0] for e in examples} - set(self.aux_shards)
            if lacking or not meta.get("aux_layers"):
                raise FeatureCacheError(
                    f"feature cache {self.folder} lacks aux features (layers "
                    f"{list(self.aux_layers)}) in {len(lacking)} shards these examples use; "
                    "`python data/cache_features.py` with this run's overrides adds them"
                )

    def entropy(self, key: str) -> torch.Tensor | None:
        """(L,) float32 target entropy of one example, None if its shard has none (old cache)."""
        s, offset, length, _ = self.index[key]
        ent = self.entropy_shards[s]
        return None if ent is None else torch.from_numpy(np.array(ent[offset : offset + length]))

    def __getitem__(self, key: str) -> torch.Tensor:
        """(L, d) f of one example; (L, (1 + n) d) [f ; aux] when read with aux_layers."""
        s, offset, length, _ = self.index[key]
        f = self._read(self.shards[s], offset, length)
        if not self.aux_layers:
            return f
        return torch.cat([f, self._read(self.aux_shards[s], offset, length)], dim=-1)

    def _read(self, shard: np.ndarray, offset: int, length: int) -> torch.Tensor:
        t = torch.from_numpy(np.array(shard[offset : offset + length]))  # copy out of the memmap
        return t.view(torch.bfloat16) if self.torch_dtype == torch.bfloat16 else t
