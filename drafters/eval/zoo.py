"""Drafters shipped with the repository, and the τ each must keep (docs/design.md section 6).

A shipped drafter lives in `zoo/<target>/<kind>/`: an exported drafter folder (config.json and
model.safetensors, in bf16 to keep the repository small) plus `zoo.json`, which says how it was
made (the training, tuning and export commands), what the reference benchmark measured for it,
and its τ on ZOO_PROMPTS: fixed prompts decoded greedily by the fp32 target with the drafter's
own tree and no gate, which is deterministic, recorded when it was shipped. tests/test_zoo.py
decodes every shipped drafter again and fails when its output leaves plain greedy or its τ
falls more than TAU_MARGIN below the record, so a decoder or loader change that costs
acceptance fails CI. A gate is left out of the check on purpose: gates decide from step costs
measured on the running machine, so their τ is not a property of the code alone.

    python -m drafters.eval.zoo record zoo/smollm2_135m/falcon   # (re)write its τ in zoo.json
    python -m drafters.eval.zoo check zoo/smollm2_135m/falcon    # its τ now vs the record
    python -m drafters.eval.zoo ship --bench outputs/results/bench/mt_bench \\
        --out zoo/smollm2_135m                  # the best drafter of each kind, bf16, recorded

`ship` reads a finished `drafters-bench` run (benchmarks/results.sh writes one), picks for each
drafter kind the method with the highest speedup over HF greedy on all questions and turns,
re-exports that drafter's checkpoint in bf16 with the same tree, and records it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ZOO_FILE = "zoo.json"
# First turns of four MT-Bench questions (writing, reasoning, coding, extraction): the kinds of
# text a drafter sees in the demo, short enough to decode in seconds each.
ZOO_PROMPTS = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
    "experiences and must-see attractions.",
    "Imagine you are participating in a race with a group of people. If you have just overtaken "
    "the second person, what's your current position? Where is the person you just overtook?",
    "Develop a Python program that reads all the text files under a directory and returns top-5 "
    "words with the most number of occurrences.",
    "Extract the following information from the presented texts: The name of the book, the "
    'author, the main character, the year of publication. Output in the format of "main '
    'character, book, author, year of publication", one book per line.',
)
ZOO_MAX_NEW_TOKENS = 64
TAU_MARGIN = 0.05  # absolute: fp32 kernels round differently on other processors
KINDS = ("medusa", "cerberus", "falcon")


class ZooError(ValueError):
    pass


def measure_tau(target, drafter, prompts=ZOO_PROMPTS, max_new_tokens=ZOO_MAX_NEW_TOKENS) -> dict:
    """τ of `drafter` (its own tree, no gate) on `prompts`, pooled as the benchmark pools it
    (new tokens - 1 over verification forwards, summed over prompts); raises ZooError when an
    output differs from the target's plain greedy output."""
    from drafters.data.chat import render_prompt
    from drafters.eval.methods import hf_method
    from drafters.eval.records import first_divergence
    from drafters.speculate import speculative_decode

    greedy = hf_method(target, "hf_greedy")
    rows = []
    for i, text in enumerate(prompts):
        ids = render_prompt(target.tokenizer, [{"role": "user", "content": text}])
        input_ids = torch.tensor([ids], device=target.device)
        ref, _ = greedy.generate(input_ids, max_new_tokens)
        res = speculative_decode(target, drafter, input_ids, max_new_tokens, gate="none")
        out = res.output_ids.tolist()
        if out != ref:
            raise ZooError(
                f"{drafter.folder}: prompt {i} decodes differently from plain greedy (first "
                f"difference at token {first_divergence(out, ref)}): the decoder is not lossless"
            )
        rows.append({"new_tokens": res.new_tokens, "verify_forwards": res.verify_forwards})
    forwards = sum(r["verify_forwards"] for r in rows)
    emitted = sum(max(r["new_tokens"] - 1, 0) for r in rows)
    return {"tau": emitted / forwards if forwards else float("nan"), "per_prompt": rows}


def read_zoo(folder: str | Path) -> dict:
    path = Path(folder) / ZOO_FILE
    if not path.is_file():
        raise ZooError(f"{path} is missing: record it with `python -m drafters.eval.zoo record "
                       f"{folder}`")  # fmt: skip
    entry = json.loads(path.read_text())
    if not isinstance(entry.get("tau"), dict) or "tau" not in entry["tau"]:
        raise ZooError(f"{path}: no tau.tau entry (record it again)")
    return entry


def _target_for(folder: Path, target=None):
    from drafters.export import load_drafter, read_config
    from drafters.target import load_target

    if target is None:
        target = load_target(None, read_config(folder)["target"], "float32")
    if target.dtype != torch.float32:
        raise ZooError(f"τ is recorded and checked with the fp32 target, not {target.dtype}")
    return target, load_drafter(folder, target)


def record(folder: str | Path, target=None, **extra) -> dict:
    """Measure τ of the drafter in `folder` and write it to its zoo.json (keeping the file's other
    entries; `extra` adds or replaces entries, e.g. made_by, bench)."""
    from drafters.machine import describe

    folder = Path(folder)
    target, drafter = _target_for(folder, target)
    path = folder / ZOO_FILE
    entry = json.loads(path.read_text()) if path.is_file() else {}
    entry.update(extra)
    entry["tau"] = {
        **measure_tau(target, drafter),
        "prompts": "ZOO_PROMPTS (drafters/eval/zoo.py)",
        "max_new_tokens": ZOO_MAX_NEW_TOKENS,
        "gate": "none",
        "target_dtype": "float32",
        "machine": describe(),
        "torch": torch.__version__,
    }
    path.write_text(json.dumps(entry, indent=1) + "\n")
    return entry


def check(folder: str | Path, target=None, margin: float = TAU_MARGIN) -> tuple[float, float]:
    """(τ now, τ recorded) of a shipped drafter; raises ZooError when the output is not plain
    greedy or τ fell below the record minus `margin`."""
    folder = Path(folder)
    recorded = float(read_zoo(folder)["tau"]["tau"])
    target, drafter = _target_for(folder, target)
    now = measure_tau(target, drafter)["tau"]
    if not now >= recorded - margin:
        raise ZooError(
            f"{folder}: τ {now:.3f} on ZOO_PROMPTS, recorded {recorded:.3f} (margin {margin}): "
            "a change to decoding or loading costs acceptance"
        )
    return now, recorded


def shipped(root: str | Path = "zoo") -> list[Path]:
    """Every shipped drafter folder under `root` (zoo/<target>/<kind>/ with a zoo.json)."""
    return sorted(p.parent for p in Path(root).glob(f"*/*/{ZOO_FILE}"))


def best_per_kind(bench_folder: str | Path) -> dict[str, dict]:
    """{kind: {"method", "drafter", "gate", "speedup", "tau", "tokens_per_s", "lossless"}}: the
    fastest method of each drafter kind in a complete benchmark run, over all its questions and
    turns; lossless on every question, and not a hybrid tree (n-gram candidates merged in)."""
    from drafters.eval.records import BASELINE, read_records
    from drafters.eval.report import summarize

    folder = Path(bench_folder)
    run_file = folder / "run.json"
    if not run_file.is_file():
        raise ZooError(f"{run_file} is missing: run the benchmark first")
    run = json.loads(run_file.read_text())
    by_q, _ = read_records(folder)
    ids = run["settings"]["question_ids"]
    missing = [q for q in ids if q not in by_q]
    if missing:
        raise ZooError(f"{folder}: {len(missing)} of {len(ids)} questions not run yet")
    rows = summarize([r for q in ids for r in by_q[q]], list(run["methods"]), BASELINE)
    best: dict[str, dict] = {}
    for row in rows:
        info = run["methods"][row["method"]]
        if row["category"] != "all" or info["kind"] not in KINDS or row["speedup"] is None:
            continue
        if not row["lossless"]:
            continue  # never ship what was not lossless on every question
        if "hybrid" in (info["gate"] or ""):
            continue  # its speed is partly the context's n-grams, not the shipped drafter's
        kind = info["kind"]
        if kind not in best or row["speedup"] > best[kind]["speedup"]:
            best[kind] = {"method": row["method"], "drafter": info["drafter"],
                          "gate": info["gate"], "speedup": row["speedup"], "tau": row["tau"],
                          "tokens_per_s": row["tokens_per_s"], "lossless": row["lossless"],
                          "questions": len(ids)}  # fmt: skip
    return best


def ship(bench_folder: str | Path, out: str | Path, made_by: dict | None = None,
         target=None) -> list[Path]:  # fmt: skip
    """The best drafter of each kind in `bench_folder`, re-exported in bf16 from its checkpoint
    with its tree into out/<kind>/, with its zoo.json recorded (`target`: the fp32 target, loaded
    from the drafters' identity when None). made_by: {drafter name: how it was made}."""
    from drafters.export import export_checkpoint, read_config

    made_by = made_by or {}
    folders = []
    for kind, b in best_per_kind(bench_folder).items():
        cfg = read_config(b["drafter"])
        ckpt = (cfg.get("source") or {}).get("checkpoint")
        if not ckpt or not Path(ckpt).is_file():
            raise ZooError(f"{b['drafter']}: its checkpoint {ckpt!r} is not on this machine")
        dest = Path(out) / kind
        export_checkpoint(ckpt, dest, "bfloat16", cfg["tree"]["spec"], overwrite=True)
        name = Path(b["drafter"]).name
        bench = {**b, "drafter": name, "run": str(bench_folder)}
        record(dest, target, made_by=made_by.get(name, ""), bench=bench)
        folders.append(dest)
        print(f"[zoo] {kind}: {name} ({b['method']}, {b['speedup']:.2f}x) -> {dest}",
              file=sys.stderr)  # fmt: skip
    return folders


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drafters.eval.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="measure τ and write it to FOLDER/zoo.json")
    r.add_argument("folder")
    r.add_argument("--made-by", default=None, help="how it was made (kept in zoo.json)")
    c = sub.add_parser("check", help="τ now vs the recorded τ, for each FOLDER")
    c.add_argument("folder", nargs="*", help="default: every shipped drafter under zoo/")
    s = sub.add_parser("ship", help="the best drafter of each kind of a benchmark run")
    s.add_argument("--bench", required=True, help="a complete drafters-bench --out folder")
    s.add_argument("--out", required=True, help="zoo/<target>")
    s.add_argument("--made-by", default=None,
                   help="a JSON file {drafter name: how it was made}")  # fmt: skip
    args = p.parse_args(argv)
    try:
        if args.command == "record":
            extra = {} if args.made_by is None else {"made_by": args.made_by}
            tau = record(args.folder, **extra)["tau"]["tau"]
            print(f"{args.folder}: τ {tau:.3f} recorded")
        elif args.command == "check":
            for folder in args.folder or shipped():
                now, rec = check(folder)
                print(f"{folder}: τ {now:.3f} (recorded {rec:.3f}): ok")
        else:
            made_by = json.loads(Path(args.made_by).read_text()) if args.made_by else None
            ship(args.bench, args.out, made_by)
    except (ZooError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
