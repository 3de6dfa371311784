"""Which precision to distil the corpus in: the same drafter trained on the same conversations
answered by two engines (e.g. vLLM fp32 and vLLM bf16), then decoded beside the fp32 target.

    python benchmarks/corpus_precision.py --batches 6 data.features=offline --corpora \\
        fp32=data/distilled/smollm2_135m/train bf16=data/distilled/smollm2_135m_bf16/train

The corpora are two distillations of the same source with the same batches (`data/distill.py`
with the same overrides but `target.dtype` and the engine; resumable runs, possibly unfinished).
For each: the first --batches batch files (both must have them) are merged into
`--out/<name>/train` (same conversations in both), the offline feature cache is built
(`python data/cache_features.py`), `python train.py +experiment=<--experiment>` trains under the
experiment's budget rule (early stopping and best.ckpt on val/accept_len_est), and its exported
drafter decodes held-out ShareGPT first turns (never distilled, never trained on) with the fp32
target beside the plain AR loop, every output checked against AR's. A bf16 corpus is only as
good as its labels are the fp32 target's: the held-out τ against the fp32 target says what its
~1% foreign labels cost a drafter.

Resumable: merged folders, caches, trained runs and decoded results (`--out/<name>.json`) are
kept. About an hour a corpus on one core: pin it (`taskset -c 0`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from heldout import (
    ROOT,
    add_run_args,
    decode_heldout,
    heldout_depths,
    start,
    steps_cell,
    train_run,
)

from drafters.data.corpus import finalize, shard_path


def merge_first_batches(src: Path, dst: Path, batches: int) -> dict:
    """`dst`: a distillation folder holding links to the first `batches` batch files of `src`,
    merged into its dataset. Returns the merge statistics."""
    if (dst / "stats.json").is_file():
        return json.loads((dst / "stats.json").read_text())
    missing = [b for b in range(batches) if not shard_path(src, b).is_file()]
    if missing:
        raise SystemExit(f"{src}: batch files {missing[:5]} are not distilled yet; resume it or "
                         "lower --batches")  # fmt: skip
    (dst / "shards").mkdir(parents=True, exist_ok=True)
    manifest = json.loads((src / "manifest.json").read_text())
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for b in range(batches):
        link = shard_path(dst, b)
        if not link.exists():
            link.symlink_to(shard_path(src, b).resolve())
    _, stats = finalize(dst, manifest["target"], partial=True)
    return stats


def first_answers(folder: Path, batches: int) -> dict[str, list[int]]:
    """key -> the first answer's token ids, over the first `batches` batch files."""
    from drafters.data.corpus import load_records

    return {r["key"]: r["response_ids"][0] for r in load_records(folder, batches)
            if r["response_ids"]}  # fmt: skip


def agreement(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict:
    """Identical first answers and their mean common prefix (tokens), over the keys of both."""
    keys = sorted(set(a) & set(b))
    same, prefix = 0, 0
    for key in keys:
        x, y = a[key], b[key]
        pairs = zip(x, y, strict=False)
        n = next((i for i, (u, v) in enumerate(pairs) if u != v), min(len(x), len(y)))
        prefix += n
        same += x == y
    return {"answers": len(keys), "identical": same,
            "mean_common_prefix": round(prefix / max(len(keys), 1), 1)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpora", nargs="+", required=True, help="NAME=DISTILLATION_FOLDER ...")
    p.add_argument("--batches", type=int, default=8, help="first batch files of each corpus")
    p.add_argument("--experiment", default="falcon_smollm2")
    p.add_argument("--depth", type=int, default=4, help="chain depth decoded")
    p.add_argument("--max-length", type=int, default=512, help="as the training runs")
    p.add_argument("--val-fraction", type=float, default=0.05, help="as the training runs")
    add_run_args(p, "corpus_precision")
    args = p.parse_args()
    for spec in args.corpora:  # before the target loads
        name, _, folder = spec.partition("=")
        if not (Path(folder) / "manifest.json").is_file():
            p.error(f"--corpora {spec}: {folder!r} holds no distillation (no manifest.json); "
                    "give NAME=FOLDER pairs, and train.py overrides before --corpora")  # fmt: skip
    target, prompts, out = start(args)
    rows = []
    for spec in args.corpora:
        name, _, folder = spec.partition("=")
        src = Path(folder)
        result_path = out / f"{name}.json"
        if result_path.is_file():
            rows.append({**json.loads(result_path.read_text()), "folder": str(src)})
            continue
        merged = out / name / "train"
        stats = merge_first_batches(src, merged, args.batches)
        over = [f"data.dataset_dir={merged}", f"data.cache_dir={out / name / 'features'}",
                *args.overrides]  # fmt: skip
        if "data.features=offline" in args.overrides:
            cmd = [sys.executable, "data/cache_features.py", f"+experiment={args.experiment}",
                   *over]  # fmt: skip
            print(f"[{name}] " + " ".join(cmd), flush=True)
            subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
        run_dir = train_run(f"precision_{name}", args.experiment, over, args.log_dir)
        row = decode_heldout(run_dir, target, prompts, args.max_new_tokens, args.depth)
        engine = json.loads((src / "manifest.json").read_text()).get("engine", {})
        row.update(name=name, engine=engine, conversations=stats["conversations"],
                   answer_tokens=stats["response_tokens"])  # fmt: skip
        result_path.write_text(json.dumps(row, indent=1))
        rows.append({**row, "folder": str(src)})
        print(f"[precision] {json.dumps(row)}", flush=True)
    # the first corpus is the reference the others are compared with: its answers, and the
    # per-depth rates of every drafter on its held-out conversations (offline cache only)
    first = first_answers(Path(rows[0]["folder"]), args.batches)
    ref = out / rows[0]["name"]
    for r in rows:
        r["first_answers_vs"] = agreement(first, first_answers(Path(r["folder"]), args.batches))
        r["ref_rates"] = (
            heldout_depths(Path(args.log_dir) / "train" / r["run"], target, ref / "train",
                           ref / "features", args.max_length, args.val_fraction)
            if (ref / "features" / "validation" / "meta.json").is_file() else None
        )  # fmt: skip
    print(f"\nFirst {args.batches} batch files of each corpus; {len(prompts)} held-out ShareGPT "
          f"first turns, {args.max_new_tokens} new tokens, fp32 target, greedy, chain of depth "
          f"{args.depth}, every output equal to AR's\n")  # fmt: skip
    heads = " | ".join(f"P(a>={k})" for k in range(1, args.depth + 1))
    print(f"| corpus | engine, dtype | conversations | answer tokens | first answers identical "
          f"to {rows[0]['name']}'s (mean common prefix) | steps | τ | {heads} "
          f"| top-1 rate per depth on {rows[0]['name']}'s held-out answers |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|" + "---:|" * args.depth + "---|")
    for r in rows:
        e, v = r["engine"], r["first_answers_vs"]
        depth = " | ".join(f"{x:.3f}" for x in r["accept_at_depth"])
        rates = " ".join(f"{x:.3f}" for x in r["ref_rates"]) if r["ref_rates"] else "-"
        print(f"| {r['name']} | {e.get('engine')} {e.get('version')}, {e.get('dtype')} "
              f"| {r['conversations']} | {r['answer_tokens']:,} "
              f"| {v['identical']}/{v['answers']} ({v['mean_common_prefix']}) "
              f"| {steps_cell(r)} | {r['tau']:.3f} | {depth} | {rates} |")  # fmt: skip


if __name__ == "__main__":
    main()
