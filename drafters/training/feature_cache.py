"""Offline target features: computed once, stored as memory-mapped shards, reused by every run.

Layout of a cache folder:

    meta.json            target identity, examples fingerprint, dtype, hidden size, totals
    shard-000000.npy     (tokens, d) features f_j of a run of consecutive examples
    shard-000000.json    the keys and token counts of those examples, in order
    shard-000000.entropy.npy  (tokens,) float32 entropy H(p_j) of the target's distribution
    ...

Only `f` is stored (~2·d bytes a token in bf16): the target's distribution p_j = softmax(W f_j)
is recomputed from it with the frozen LM head, so the KL loss needs no vocabulary-sized cache.
The one thing computed from the whole vocabulary that a step would otherwise recompute every
epoch, the entropy the gates read, is stored once (4 bytes a token, from the unrounded f). A
cache built before it existed has no entropy files (steps then compute it themselves) until
`python data/cache_features.py` runs again and adds them, from the stored f.
Shards are written atomically and the build resumes from the first missing shard. A cache made
for another target, tokenizer or data is refused with an error naming both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from drafters.io_utils import atomic_file, write_json_atomic
from drafters.models.gate import entropy
from drafters.target import Target
from drafters.training.examples import ConversationExamples, collate

DTYPES = {
    "bfloat16": (torch.bfloat16, np.uint16),
    "float16": (torch.float16, np.float16),
    "float32": (torch.float32, np.float32),
}


class FeatureCacheError(RuntimeError):
    pass


@torch.no_grad()
def target_entropy(target: Target, f: torch.Tensor, rows: int = 512) -> torch.Tensor:
    """(..., d) features -> (...,) float32 entropy of softmax(lm_head(f)), `rows` at a time (a
    (rows, V) logits block at most)."""
    flat = f.reshape(-1, f.shape[-1])
    out = [entropy(target.lm_head(flat[i : i + rows])) for i in range(0, flat.shape[0], rows)]
    return torch.cat(out).reshape(f.shape[:-1]) if out else flat.new_zeros(f.shape[:-1]).float()


def _meta(target: Target, examples: ConversationExamples, dtype: str, shard_examples: int):
    return {
        "target": target.identity.to_dict(),
        "examples_fingerprint": examples.fingerprint(),
        "num_examples": len(examples),
        "num_tokens": examples.num_tokens,
        "hidden_size": target.hidden_size,
        "dtype": dtype,
        "shard_examples": shard_examples,
    }


def build_feature_cache(
    target: Target,
    examples: ConversationExamples,
    folder: str | Path,
    dtype: str = "bfloat16",
    batch_size: int = 8,
    shard_examples: int = 256,
) -> dict:
    """Compute and store f for every example (resumable). Returns the cache's meta dict."""
    if dtype not in DTYPES:
        raise FeatureCacheError(f"feature cache dtype {dtype!r}: use one of {sorted(DTYPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = _meta(target, examples, dtype, shard_examples)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        problem = target.identity.mismatch(old["target"], f"feature cache {folder}")
        # the target is compared by `mismatch` (an older identity on the keys it holds)
        skip = ("bytes_per_token", "target")
        settings = {k: v for k, v in meta.items() if k not in skip}
        if problem or {k: v for k, v in old.items() if k not in skip} != settings:
            raise FeatureCacheError(
                (problem or f"feature cache {folder} was built from other examples or settings")
                + "; delete it or choose another data.cache_dir"
            )
    torch_dtype, np_dtype = DTYPES[dtype]
    n_shards = -(-len(examples) // shard_examples)
    pad = target.tokenizer.pad_token_id
    t0, tokens = time.perf_counter(), 0
    bar = tqdm(total=len(examples), unit="conv", desc="features", dynamic_ncols=True)
    for s in range(n_shards):
        lo, hi = s * shard_examples, min(len(examples), (s + 1) * shard_examples)
        npy, idx = folder / f"shard-{s:06d}.npy", folder / f"shard-{s:06d}.json"
        ent_path = folder / f"shard-{s:06d}.entropy.npy"
        if npy.exists() and idx.exists():
            if not ent_path.exists():  # a shard of an older cache: entropy from its stored f
                stored = torch.from_numpy(np.load(npy))
                stored = stored.view(torch.bfloat16) if dtype == "bfloat16" else stored
                h = target_entropy(target, stored.to(target.device, target.dtype)).cpu()
                with atomic_file(ent_path) as tmp:
                    np.save(tmp, h.numpy())
            bar.update(hi - lo)
            continue
        # sort by length inside the shard so batches carry little padding
        order = sorted(range(lo, hi), key=lambda i: len(examples[i].input_ids))
        feats: dict[int, torch.Tensor] = {}
        ents: dict[int, torch.Tensor] = {}
        for b in range(0, len(order), batch_size):
            chunk = order[b : b + batch_size]
            batch = collate([examples[i] for i in chunk], pad)
            ids = batch["input_ids"].to(target.device)
            f, _ = target.features(ids, batch["attention_mask"].to(target.device))
            for row, i in enumerate(chunk):
                fi = f[row, : len(examples[i].input_ids)]
                feats[i] = fi.to("cpu", torch_dtype)
                ents[i] = target_entropy(target, fi).cpu()
            bar.update(len(chunk))
        stacked = torch.cat([feats[i] for i in range(lo, hi)])
        tokens += stacked.shape[0]
        arr = (
            stacked.view(torch.int16).numpy().view(np_dtype)
            if dtype == "bfloat16"
            else (stacked.numpy())
        )
        with atomic_file(ent_path) as tmp:  # before the features: a shard is its .npy + .json
            np.save(tmp, torch.cat([ents[i] for i in range(lo, hi)]).numpy())
        with atomic_file(npy) as tmp:
            np.save(tmp, arr)
        entries = [[examples[i].key, len(examples[i].input_ids)] for i in range(lo, hi)]
        with atomic_file(idx) as tmp:
            tmp.write_text(json.dumps(entries))
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    bar.close()
    size = sum(p.stat().st_size for p in folder.glob("shard-*.npy") if "entropy" not in p.name)
    meta["bytes_per_token"] = round(size / max(1, examples.num_tokens), 1)
    write_json_atomic(meta_path, meta)
    return meta


class FeatureCache:
    """Read side: `cache[key]` -> (L, d) features of one example, memory-mapped from disk."""

    def __init__(self, folder: str | Path, target: Target, examples: ConversationExamples):
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
        if meta["examples_fingerprint"] != examples.cache_fingerprint():
            raise FeatureCacheError(
                f"feature cache {self.folder} was built from other examples (data or max_length "
                "changed); rebuild it with `python data/cache_features.py`"
            )
        self.meta = meta
        self.torch_dtype = DTYPES[meta["dtype"]][0]
        self.index: dict[str, tuple[int, int, int]] = {}  # key -> (shard, offset, length)
        self.shards: list[np.ndarray] = []
        self.entropy_shards: list[np.ndarray | None] = []
        for s, idx in enumerate(sorted(self.folder.glob("shard-*.json"))):
            self.shards.append(np.load(idx.with_suffix(".npy"), mmap_mode="r"))
            ent = idx.with_suffix(".entropy.npy")
            self.entropy_shards.append(np.load(ent, mmap_mode="r") if ent.exists() else None)
            offset = 0
            for key, length in json.loads(idx.read_text()):
                self.index[key] = (s, offset, length)
                offset += length
        missing = sum(e.key not in self.index for e in examples)
        if missing:
            raise FeatureCacheError(
                f"feature cache {self.folder} is incomplete ({missing} examples missing); "
                "finish it with `python data/cache_features.py` (it resumes)"
            )

    def entropy(self, key: str) -> torch.Tensor | None:
        """(L,) float32 target entropy of one example, None if its shard has none (old cache)."""
        s, offset, length = self.index[key]
        ent = self.entropy_shards[s]
        return None if ent is None else torch.from_numpy(np.array(ent[offset : offset + length]))

    def __getitem__(self, key: str) -> torch.Tensor:
        s, offset, length = self.index[key]
        arr = np.array(self.shards[s][offset : offset + length])  # copy out of the memmap
        t = torch.from_numpy(arr)
        return t.view(torch.bfloat16) if self.torch_dtype == torch.bfloat16 else t


def cache_features(cfg) -> dict:
    """The `python data/cache_features.py [train.py overrides]` job: both splits of the
    configured data, for the configured target, into `data.cache_dir`."""
    from hydra.utils import instantiate

    target = instantiate(cfg.target)
    # every example: a run on a subset (data.max_train_tokens) reads its part of this cache
    dm = instantiate(cfg.data, max_train_tokens=None).attach(target)
    dm.setup()
    dtype = cfg.get("features_dtype", "bfloat16")
    out = {}
    for split, examples in (("train", dm.train_set), ("validation", dm.val_set)):
        if examples.dropped:
            print(
                f"[features] {split}: {examples.dropped} conversations skipped (no assistant "
                f"token within data.max_length={dm.max_length})"
            )
        meta = build_feature_cache(target, examples, dm.cache_folder(split), dtype=dtype)
        out[split] = meta
        print(
            f"[features] {split}: {meta['num_examples']} examples, {meta['num_tokens']} tokens, "
            f"{meta['bytes_per_token']} bytes/token ({dtype}) in {dm.cache_folder(split)}"
        )
    return out
