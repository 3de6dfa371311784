"""The distilled corpus on disk: per-batch shards, their merge into an HF `datasets` dataset
whose metadata holds the target's identity, and the loader that checks it against a target.

`drafters.data.distillation` writes the shards; this module owns their format
(`shards/batch-NNNNNN.json`, `manifest.json`, `dataset/`, `stats.json`) and everything that
reads them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from drafters.io_utils import staged_dir, write_json_atomic


class DistillResumeError(RuntimeError):
    pass


def shard_path(out_dir: Path, batch_index: int) -> Path:
    return out_dir / "shards" / f"batch-{batch_index:06d}.json"


def load_records(
    out_dir: str | Path, num_batches: int | None = None, require_all: bool = True
) -> list[dict]:
    """All distilled records in source order, checked for overlap and (given the expected
    number of batches, unless require_all=False) for missing batches."""
    out_dir = Path(out_dir)
    paths = sorted((out_dir / "shards").glob("batch-*.json"))
    if num_batches is not None and require_all:
        have = {int(p.stem.split("-")[1]) for p in paths}
        missing = sorted(set(range(num_batches)) - have)
        if missing:
            raise DistillResumeError(
                f"{out_dir}: {len(missing)} of {num_batches} batches are not distilled yet "
                f"(first: {missing[:5]}); run the missing shards (same command) before merging"
            )
    if num_batches is not None:
        paths = [p for p in paths if int(p.stem.split("-")[1]) < num_batches]
    records, seen = [], set()
    for path in paths:
        shard = json.loads(path.read_text())
        for r in shard["records"]:
            if r["key"] in seen:
                raise DistillResumeError(f"{path}: conversation {r['key']} appears in two shards")
            seen.add(r["key"])
            records.append(r)
    records.sort(key=lambda r: r["source_index"])
    return records


def _features():
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features(
        {
            "id": Value("string"),
            "key": Value("string"),
            "source_index": Value("int64"),
            "messages": List(message),
            "response_ids": List(List(Value("int32"))),
            "finish": List(Value("string")),
        }
    )


def finalize(
    out_dir: str | Path,
    target_identity: dict,
    run_stats: dict | None = None,
    drop_length_cut: bool = False,
    partial: bool = False,
):
    """Merge shards into `out_dir/dataset` (Arrow), atomically; returns (dataset, stats).

    partial=True merges the batches distilled so far (a run still going, or stopped): a
    snapshot to train on meanwhile, marked in stats["partial"]; the full merge replaces it.

    A conversation ends at its first answer cut by max_new_tokens (nothing after it was
    generated). drop_length_cut=False keeps that answer as the last turn, marked "length", and
    the training examples leave its end-of-turn token out of the loss (the target never said
    it there); True drops the cut answer too.
    """
    from datasets import Dataset

    DATASET_FEATURES = _features()
    out_dir = Path(out_dir)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    drop_cut = drop_length_cut
    rows, finish, stopped = [], Counter(), Counter()
    total = manifest.get("num_batches")
    records = load_records(out_dir, total, require_all=not partial)
    dropped_turns = dropped_convs = 0
    for r in records:
        finish.update(r["finish"])
        if r["stopped"]:
            stopped[r["stopped"]] += 1
        n = len(r["finish"])
        if drop_cut and "length" in r["finish"]:
            n = r["finish"].index("length")
            dropped_turns += len(r["finish"]) - n
        if n == 0:
            dropped_convs += 1
            continue
        head = 1 if r["messages"] and r["messages"][0]["role"] == "system" else 0
        rows.append(
            {
                "id": r["id"],
                "key": r["key"],
                "source_index": r["source_index"],
                "messages": r["messages"][: head + 2 * n],
                "response_ids": r["response_ids"][:n],
                "finish": r["finish"][:n],
            }
        )
    n_tokens = sum(len(ids) for row in rows for ids in row["response_ids"])
    stats = {
        "conversations": len(rows),
        "assistant_turns": sum(len(row["finish"]) for row in rows),
        "response_tokens": n_tokens,
        "turns_by_finish": dict(finish),
        "conversations_stopped_early": dict(stopped),
        "length_cut_turns_dropped": dropped_turns,
        "conversations_dropped": dropped_convs,
        "mean_response_tokens": round(n_tokens / max(1, sum(len(r["finish"]) for r in rows)), 1),
    }
    if run_stats:
        stats["run"] = run_stats
    if partial:
        merged = len({int(p.stem.split("-")[1]) for p in (out_dir / "shards").glob("batch-*.json")
                      if total is None or int(p.stem.split("-")[1]) < total})  # fmt: skip
        stats["partial"] = {"batches_merged": merged, "batches_total": total}
    stats["drop_length_cut"] = drop_cut
    meta = {"target": target_identity, "distill": manifest, "stats": stats}
    columns = {name: [row[name] for row in rows] for name in DATASET_FEATURES}
    ds = Dataset.from_dict(columns, features=DATASET_FEATURES)
    ds.info.description = json.dumps(meta)
    with staged_dir(out_dir / "dataset") as tmp:
        ds.save_to_disk(str(tmp))
        write_json_atomic(tmp / "drafters_meta.json", meta)
    write_json_atomic(out_dir / "stats.json", stats)
    return ds, stats


def dataset_meta(path: str | Path) -> tuple[Path, dict]:
    """The dataset folder at `path` (the `dataset` folder or its parent) and its
    drafters_meta.json (target identity, distillation manifest, statistics), without the data."""
    path = Path(path)
    if (path / "dataset").is_dir():
        path = path / "dataset"
    meta_path = path / "drafters_meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no distilled dataset at {path}; make it with `python data/distill.py` "
            "(see README: Data)"
        )
    return path, json.loads(meta_path.read_text())


def check_dataset_target(path: str | Path, target_identity) -> None:
    """Refuse a dataset another target distilled (TargetIdentity.mismatch names both)."""
    path, meta = dataset_meta(path)
    problem = target_identity.mismatch(meta["target"], f"distilled dataset {path}")
    if problem:
        raise ValueError(problem)


def load_distilled(path: str | Path, target_identity=None):
    """The distilled dataset at `path` (the `dataset` folder or its parent), checked against the
    target it will train a drafter for."""
    from datasets import load_from_disk

    path, meta = dataset_meta(path)
    if target_identity is not None:
        check_dataset_target(path, target_identity)
    return load_from_disk(str(path)), meta
