"""The committed copy of a distilled corpus: `data/reference/<run_name>/<split>/`, the manifest and
every finished batch file, xz-compressed, so that a corpus distilled once is not distilled again on
another machine or clone (a machine can be replaced, and `data/distilled/` is git-ignored).

    publish(out_dir, ref_dir)             copy the finished batch files of a distillation there
    restore(ref_dir, out_dir, manifest)   fill a distillation folder with the reference's batch
                                          files, if both were made alike

`python data/distill.py <overrides> stage=publish` publishes; every other stage restores first
(`reference_dir` in conf/distill.yaml), so the same command that made the corpus rebuilds it from
the copy and generates only the batches the copy lacks.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from drafters.data.corpus import shard_path
from drafters.io_utils import atomic_file, write_json_atomic
from drafters.target_identity import TargetIdentity

SUFFIX = ".json.xz"
# what a distillation folder and its reference must agree on, besides the target and the engine
SETTINGS = ("source", "split", "val_fraction", "config", "config_fingerprint")


def ref_shards(ref_dir: Path) -> dict[int, Path]:
    return {int(p.name.split("-")[1].split(".")[0]): p for p in ref_dir.glob(f"batch-*{SUFFIX}")}


def publish(out_dir: str | Path, ref_dir: str | Path) -> dict:
    """Copy the manifest and every finished batch file of `out_dir` into `ref_dir`, compressed;
    batch files already there are kept (a batch file never changes once written). Returns what
    `ref_dir` holds."""
    out_dir, ref_dir = Path(out_dir), Path(ref_dir)
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{out_dir}: no distillation to publish (no manifest.json)")
    manifest = json.loads(manifest_path.read_text())
    ref_dir.mkdir(parents=True, exist_ok=True)
    if (ref_dir / "manifest.json").is_file():
        problem = _disagreement(json.loads((ref_dir / "manifest.json").read_text()), manifest)
        if problem:
            raise ValueError(f"{ref_dir} holds another distillation ({problem}); publish elsewhere")
    have = ref_shards(ref_dir)
    added = 0
    for path in sorted((out_dir / "shards").glob("batch-*.json")):
        b = int(path.stem.split("-")[1])
        if b in have:
            continue
        with atomic_file(ref_dir / f"{path.stem}{SUFFIX}") as tmp:
            tmp.write_bytes(lzma.compress(path.read_bytes(), preset=9))
        added += 1
    write_json_atomic(ref_dir / "manifest.json", manifest)
    summary = _summary(ref_dir, manifest)
    write_json_atomic(ref_dir / "contents.json", summary)
    print(f"[reference] {ref_dir}: +{added} batch files; {json.dumps(summary)}")
    return summary


def _summary(ref_dir: Path, manifest: dict) -> dict:
    shards = ref_shards(ref_dir)
    tokens = answers = conversations = 0
    made_on: dict[str, int] = {}
    for path in shards.values():
        shard = json.loads(lzma.decompress(path.read_bytes()))
        machine = shard.get("made_on", "not recorded")
        made_on[machine] = made_on.get(machine, 0) + 1
        for r in shard["records"]:
            conversations += 1
            answers += len(r["response_ids"])
            tokens += sum(len(ids) for ids in r["response_ids"])
    return {
        "batch_files": len(shards),
        "batch_files_total": manifest.get("num_batches"),
        "conversations": conversations,
        "answers": answers,
        "answer_tokens": tokens,
        "bytes": sum(p.stat().st_size for p in shards.values()),
        "batch_files_by_machine": made_on,
    }


def _disagreement(ref: dict, manifest: dict) -> str | None:
    """Why a distillation with `manifest` cannot use the reference `ref` (None: it can)."""
    ref_target, own_target = ref.get("target"), manifest.get("target")
    if not (TargetIdentity.is_identity(ref_target) and TargetIdentity.is_identity(own_target)):
        return "no target identity in one of the manifests"
    if set(own_target) == set(TargetIdentity.__dataclass_fields__):
        problem = TargetIdentity(**own_target).mismatch(ref_target, "the reference")
    else:  # an identity written by older code: only an exact match will do
        problem = None if own_target == ref_target else "another target identity"
    if problem:
        return problem
    diff = [k for k in SETTINGS if ref.get(k) != manifest.get(k)]
    if diff:
        return "other settings: " + ", ".join(diff)
    if manifest.get("engine") and ref.get("engine") and manifest["engine"] != ref["engine"]:
        return f"engine {ref['engine']} vs {manifest['engine']}"
    return None


def restore(ref_dir: str | Path, out_dir: str | Path, manifest: dict | None = None) -> int:
    """Decompress the reference's batch files that `out_dir` lacks, if the reference was made
    with this distillation's target, source, settings and engine (`manifest`: the one this run
    writes; None: `out_dir`'s own, or the reference's when `out_dir` has none). Returns the number
    restored; a reference made otherwise is left alone, with a line saying why."""
    ref_dir, out_dir = Path(ref_dir), Path(out_dir)
    if not (ref_dir / "manifest.json").is_file():
        return 0
    ref = json.loads((ref_dir / "manifest.json").read_text())
    own_path = out_dir / "manifest.json"
    if manifest is None:
        manifest = json.loads(own_path.read_text()) if own_path.is_file() else dict(ref)
    problem = _disagreement(ref, manifest)
    if problem:
        print(f"[reference] {ref_dir} not used: {problem}")
        return 0
    restored = 0
    (out_dir / "shards").mkdir(parents=True, exist_ok=True)
    for b, path in sorted(ref_shards(ref_dir).items()):
        dst = shard_path(out_dir, b)
        if dst.exists():
            continue
        with atomic_file(dst) as tmp:
            tmp.write_bytes(lzma.decompress(path.read_bytes()))
        restored += 1
    merged = {**manifest, "engine": manifest.get("engine") or ref.get("engine")}
    merged.setdefault("num_batches", ref.get("num_batches"))
    write_json_atomic(own_path, merged)
    if restored:
        print(f"[reference] restored {restored} batch files from {ref_dir}")
    return restored
