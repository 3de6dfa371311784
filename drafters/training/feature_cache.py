"""Offline target features: computed once, stored as memory-mapped shards, reused by every run.
The layout and the read side (`FeatureCache`) are in `drafters.training.feature_store`.

Only `f` is stored (~2·d bytes a token in bf16): the target's distribution p_j = softmax(W f_j)
is recomputed from it with the frozen LM head, so the KL loss needs no vocabulary-sized cache.
The one thing computed from the whole vocabulary that a step would otherwise recompute every
epoch, the entropy the gates read, is stored once (4 bytes a token, from the unrounded f); a
shard without it makes the steps compute it themselves.
Shards are written atomically, and an example is found by its key (conversation id + content
hash) with its tokens checked (count and digest: the answers are the target's), so a build
computes only the examples not cached yet: a killed build resumes, and a corpus that grew (a
partial merge, then the full one) adds shards for its new conversations only. A cache made for
another target or tokenizer, an example cached with other tokens (another corpus,
data.max_length changed), or a cache written before token digests, is refused, saying why.
A build with aux layers on a cache without them adds the aux files to its existing shards (one
target forward per example, as a new shard costs); the layers are recorded in meta.json and a
cache holding other ones is refused.
"""

from __future__ import annotations

import hashlib
import itertools
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
from drafters.training.feature_store import (
    DTYPES,
    FeatureCacheError,
    aux_path,
    check_cached_aux,
    other_examples,
    read_index,
    shards,
    tokens_digest,
)


@torch.no_grad()
def target_entropy(target: Target, f: torch.Tensor, rows: int = 512) -> torch.Tensor:
    """(..., d) features -> (...,) float32 entropy of softmax(lm_head(f)), `rows` at a time (a
    (rows, V) logits block at most)."""
    flat = f.reshape(-1, f.shape[-1])
    out = [entropy(target.lm_head(flat[i : i + rows])) for i in range(0, flat.shape[0], rows)]
    return torch.cat(out).reshape(f.shape[:-1]) if out else flat.new_zeros(f.shape[:-1]).float()


def _meta(target: Target, dtype: str) -> dict:
    return {"target": target.identity.to_dict(), "hidden_size": target.hidden_size, "dtype": dtype}


def _part_of(key: str, n_parts: int) -> int:
    """Which of n processes building a cache together computes this example (stable: by key)."""
    if n_parts == 1:
        return 0
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") % n_parts


def _check_meta(folder: Path, meta: dict, target: Target) -> dict:
    old = json.loads((folder / "meta.json").read_text())
    problem = target.identity.mismatch(old["target"], f"feature cache {folder}")
    if problem:  # (an older identity is compared on the keys it holds)
        raise FeatureCacheError(problem + "; delete it or choose another data.cache_dir")
    for key in ("hidden_size", "dtype"):
        if old.get(key) != meta[key]:
            raise FeatureCacheError(
                f"feature cache {folder} holds {key}={old.get(key)!r}, not {meta[key]!r}; "
                "delete it or choose another data.cache_dir"
            )
    check_cached_aux(folder, old.get("aux_layers"), meta.get("aux_layers"))
    return old


def _to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else t.numpy()


def _save(path: Path, arr: np.ndarray) -> None:
    with atomic_file(path) as tmp:
        np.save(tmp, arr)


@torch.no_grad()
def _compute(
    target: Target, exs: list, pad: int, batch_size: int, aux_layers, torch_dtype, entropy=True
):
    """Features of a list of examples, batched by length: per example (f (L, d), entropy (L,)
    or None with entropy=False (a full-vocabulary LM head pass a token), aux (L, n d) or None),
    in the list's order."""
    d = target.hidden_size
    order = sorted(range(len(exs)), key=lambda i: len(exs[i].input_ids))
    out: dict[int, tuple] = {}
    for b in range(0, len(order), batch_size):
        chunk = order[b : b + batch_size]
        batch = collate([exs[i] for i in chunk], pad)
        ids = batch["input_ids"].to(target.device)
        wide, _ = target.features(
            ids, batch["attention_mask"].to(target.device), aux_layers=aux_layers
        )
        for row, i in enumerate(chunk):
            w = wide[row, : len(exs[i].input_ids)]
            fi = w[:, :d]
            aux = w[:, d:].to("cpu", torch_dtype) if aux_layers else None
            ent = target_entropy(target, fi).cpu() if entropy else None
            out[i] = (fi.to("cpu", torch_dtype), ent, aux)
    return [out[i] for i in range(len(exs))]


def _add_aux(folder, examples, target, aux_layers, dtype, batch_size, part) -> tuple[int, int]:
    """Write the aux file of every complete shard of this part that lacks one. Returns (shards
    written, shards skipped because they hold examples this build was not given)."""
    i_part, n_parts = part
    by_key = {e.key: e for e in examples}
    todo = [
        (s, idx)
        for s, idx in shards(folder).items()
        if s % n_parts == i_part and not aux_path(idx).exists()
    ]
    written = skipped = 0
    torch_dtype = DTYPES[dtype][0]
    for _, idx in tqdm(todo, desc=f"aux features {i_part}/{n_parts}", unit="shard"):
        keys = [entry[0] for entry in json.loads(idx.read_text())]
        if any(k not in by_key for k in keys):
            skipped += 1
            continue
        rows = _compute(target, [by_key[k] for k in keys], target.tokenizer.pad_token_id,
                        batch_size, aux_layers, torch_dtype, entropy=False)  # fmt: skip
        _save(aux_path(idx), _to_numpy(torch.cat([r[2] for r in rows]), dtype))
        written += 1
    return written, skipped


def build_feature_cache(
    target: Target,
    examples: ConversationExamples,
    folder: str | Path,
    dtype: str = "bfloat16",
    batch_size: int = 8,
    shard_examples: int = 256,
    part: tuple[int, int] = (0, 1),
    aux_layers: tuple[int, ...] | None = None,
) -> dict:
    """Compute and store f for every example not cached yet (resumable, and incremental: a
    grown corpus adds shards for its new examples only). Returns the cache's meta dict.
    aux_layers: also the hidden states entering those target layers, added to shards that
    lack them.

    part=(i, n): this process computes only the examples whose key hashes to i mod n, into
    shard numbers i mod n, so n processes (one a core) fill one folder together; any later build
    (n = 1) finds nothing left to do and writes the complete meta."""
    i_part, n_parts = part
    if not 0 <= i_part < n_parts:
        raise FeatureCacheError(f"feature cache part {i_part}/{n_parts}: use i/n with 0 <= i < n")
    if dtype not in DTYPES:
        raise FeatureCacheError(f"feature cache dtype {dtype!r}: use one of {sorted(DTYPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = _meta(target, dtype)
    if aux_layers:
        meta["aux_layers"] = list(aux_layers)
    if (folder / "meta.json").exists():
        old = _check_meta(folder, meta, target)
        if not aux_layers and old.get("aux_layers"):
            aux_layers = tuple(old["aux_layers"])  # keep the cache whole: new shards get them
            meta["aux_layers"] = list(aux_layers)
    index = read_index(folder)
    changed = other_examples(folder, examples, index)
    if changed:
        raise FeatureCacheError(
            f"feature cache {folder} was built from other examples ({len(changed)} cached with "
            f"other tokens, e.g. {changed[0]}: another corpus, or data.max_length changed); "
            "delete it or choose another data.cache_dir"
        )
    todo = [e for e in examples if e.key not in index and _part_of(e.key, n_parts) == i_part]
    done = len(examples) - sum(e.key not in index for e in examples)
    free = (s for s in itertools.count(i_part, n_parts) if s not in shards(folder))
    torch_dtype = DTYPES[dtype][0]
    pad = target.tokenizer.pad_token_id
    t0, tokens = time.perf_counter(), 0
    desc = "features" if n_parts == 1 else f"features {i_part}/{n_parts}"
    bar = tqdm(total=done + len(todo), unit="conv", desc=desc, dynamic_ncols=True)
    bar.update(done)
    for lo in range(0, len(todo), shard_examples):
        part = todo[lo : lo + shard_examples]
        s = next(free)
        npy, idx = folder / f"shard-{s:06d}.npy", folder / f"shard-{s:06d}.json"
        rows = _compute(target, part, pad, batch_size, aux_layers, torch_dtype)
        bar.update(len(part))
        stacked = torch.cat([r[0] for r in rows])
        tokens += stacked.shape[0]
        # entropy, aux, features, then the index: a shard is complete once its index is written
        _save(npy.with_suffix(".entropy.npy"), torch.cat([r[1] for r in rows]).numpy())
        if aux_layers:
            _save(aux_path(idx), _to_numpy(torch.cat([r[2] for r in rows]), dtype))
        _save(npy, _to_numpy(stacked, dtype))
        with atomic_file(idx) as tmp:
            entries = [[e.key, len(e.input_ids), tokens_digest(e.input_ids)] for e in part]
            tmp.write_text(json.dumps(entries))
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    bar.close()
    if aux_layers:
        written, skipped = _add_aux(folder, examples, target, aux_layers, dtype, batch_size,
                                    (i_part, n_parts))  # fmt: skip
        meta["aux_added"] = {"shards": written, "skipped_other_examples": skipped}
        if skipped:
            print(
                f"[features] {folder}: {skipped} shards got no aux features: they hold examples "
                "this build was not given (built for a larger data.max_train_tokens); run the "
                "build with that budget to add them"
            )
    index = read_index(folder)
    size = sum(idx.with_suffix(".npy").stat().st_size for idx in shards(folder).values())
    cached = sum(entry[2] for entry in index.values())
    meta.update(
        num_examples=len(index),
        num_tokens=cached,
        bytes_per_token=round(size / max(1, cached), 1),
        this_build={"examples": len(examples), "added": len(todo)},
    )
    write_json_atomic(folder / "meta.json", meta)
    return meta


def cache_features(cfg) -> dict:
    """The `python data/cache_features.py [train.py overrides]` job: both splits of the
    configured data (the training subset of data.max_train_tokens where set), for the
    configured target, into `data.cache_dir`."""
    from hydra.utils import instantiate

    target = instantiate(cfg.target)
    # data.max_train_tokens: only that subset's training examples (all of validation). The
    # subsets are nested, so a cache built for a budget serves every smaller one, and a larger
    # budget (or null: the whole corpus) later adds only its new examples.
    dm = instantiate(cfg.data).attach(target)
    dm.setup()
    dtype = cfg.get("features_dtype", "bfloat16")
    part = str(cfg.get("features_part") or "0/1")
    try:
        i_part, n_parts = (int(x) for x in part.split("/"))
    except ValueError:
        raise FeatureCacheError(f"features_part={part!r}: write it i/n, e.g. 0/2") from None
    out = {}
    for split, examples in (("train", dm.train_set), ("validation", dm.val_set)):
        if examples.dropped:
            print(
                f"[features] {split}: {examples.dropped} conversations skipped (no assistant "
                f"token within data.max_length={dm.max_length})"
            )
        meta = build_feature_cache(
            target,
            examples,
            dm.cache_folder(split),
            dtype=dtype,
            part=(i_part, n_parts),
            aux_layers=dm.aux_layers,
        )
        out[split] = meta
        print(
            f"[features] {split}: {meta['num_examples']} examples, {meta['num_tokens']} tokens, "
            f"{meta['bytes_per_token']} bytes/token ({dtype}) in {dm.cache_folder(split)}"
        )
    return out
