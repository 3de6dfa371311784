"""Benchmark reports: the summary table (per method and category), JSON, markdown and plots.

Definitions (docs/design.md section 6), over the questions of one category (or all of them):
    tau       = sum over turns (new_tokens - 1) / sum verification forwards (prefill excluded,
                bonus included), pooled; None for methods whose forwards are not counted (HF)
    alpha     = sum accepted draft tokens / sum new tokens
    tok/s     = mean over questions of (new tokens / seconds), a question's turns pooled
    speedup   = tok/s / the baseline's tok/s on the same questions (Spec-Bench)
    lossless  = questions whose every turn equals the baseline's output, of all questions;
                in another dtype than float32 the column says "same as <baseline> (<dtype>)",
                and the report lists where each other output first leaves the baseline's
                (`divergences`): agreement measured, never assumed
    same_prefix = median over turns of the tokens equal to the baseline's before the first
                difference (the whole output for a turn that equals it); shown as a column
                beside the agreement column outside float32, where it says how soon bf16
                rounding sends an output another way
    tau_by_phase = Falcon drafters: {"r": {"steps", "tokens", "tau"}} for r = 0 .. k-1, the
                verification forwards whose root t_N has N mod k == r, the new tokens they kept
                and tau = tokens / steps (None without steps), pooled; None for other methods.
                The table shows it in a column "τ by N mod k" when some method has it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import mean, median


def _pooled(records: list[dict]) -> tuple[float | None, float | None]:
    turns = [t for r in records for t in r["turns"]]
    if not turns or any("verify_forwards" not in t for t in turns):
        return None, None
    forwards = sum(t["verify_forwards"] for t in turns)
    emitted = sum(max(t["new_tokens"] - 1, 0) for t in turns)
    new = sum(t["new_tokens"] for t in turns)
    tau = emitted / forwards if forwards else None
    alpha = sum(t["accepted_tokens"] for t in turns) / new if new else None
    return tau, alpha


def _pooled_phases(records: list[dict]) -> dict | None:
    """The turns' `tau_by_phase` counts summed, with tau per phase; None unless every turn has
    them (Falcon drafters)."""
    turns = [t for r in records for t in r["turns"]]
    if not turns or any("tau_by_phase" not in t for t in turns):
        return None
    pooled: dict[str, dict] = {}
    for t in turns:
        for phase, c in t["tau_by_phase"].items():
            p = pooled.setdefault(phase, {"steps": 0, "tokens": 0})
            p["steps"] += c["steps"]
            p["tokens"] += c["tokens"]
    return {
        phase: {**p, "tau": p["tokens"] / p["steps"] if p["steps"] else None}
        for phase, p in pooled.items()
    }


def summarize(records: list[dict], methods: list[str], baseline: str) -> list[dict]:
    """One row per (method, category), then (method, "all"); categories in first-seen order."""
    categories = list(dict.fromkeys(r["category"] for r in records))
    rows = []
    for cat in [*categories, "all"]:
        sel = [r for r in records if cat == "all" or r["category"] == cat]
        base = [r["tokens_per_s"] for r in sel if r["method"] == baseline]
        base_tps = mean(base) if base else None
        for m in methods:
            rs = [r for r in sel if r["method"] == m]
            if not rs:
                continue
            tau, alpha = _pooled(rs)
            tps = mean(r["tokens_per_s"] for r in rs)
            known = [r["lossless"] for r in rs if r["lossless"] is not None]
            turns = [t for r in rs for t in r["turns"] if t.get("lossless") is not None]
            rows.append(
                {
                    "method": m,
                    "category": cat,
                    "prompts": len(rs),
                    "new_tokens": sum(r["new_tokens"] for r in rs),
                    "tau": tau,
                    "tau_by_phase": _pooled_phases(rs),
                    "alpha": alpha,
                    "tokens_per_s": tps,
                    "speedup": tps / base_tps if base_tps else None,
                    "lossless_prompts": sum(known) if known else None,
                    "lossless": (len(known) == len(rs) and all(known)) if known else None,
                    "same_prefix": median(_same_prefix(t) for t in turns) if turns else None,
                }
            )
    return rows


def _same_prefix(turn: dict) -> int:
    """New tokens of a turn equal to the baseline's before the first difference (None: equal,
    `mark_lossless`)."""
    where = turn.get("first_divergence")
    return turn["new_tokens"] if where is None else where


def fmt(x, spec: str = ".2f") -> str:
    """A number for a table; "-" for a missing one (None, NaN)."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _phase_cell(phases: dict | None) -> str:
    """`tau_by_phase` for a table: "0: 1.52 / 1: 1.31"; "-" without it."""
    if phases is None:
        return "-"
    return " / ".join(f"{r}: {fmt(p['tau'], '.2f')}" for r, p in phases.items())


def agreement_header(settings: dict) -> str:
    """`lossless` in float32 (the strict reference); elsewhere what was checked: the same tokens
    as the baseline in the same dtype, which rounding with other row counts can break."""
    dtype = settings.get("dtype", "float32")
    return "lossless" if dtype == "float32" else f"same as hf_greedy ({dtype})"


def divergences(records: list[dict], baseline: str) -> str:
    """Every turn whose output is not the baseline's: method, question, turn, the first token
    where it differs of the new tokens; '' when none differs."""
    lines = []
    for r in records:
        if r["method"] == baseline:
            continue
        for i, t in enumerate(r["turns"]):
            if t.get("lossless") is False:
                where = t.get("first_divergence")
                lines.append(f"| {r['method']} | {r['question_id']} | {i + 1} | "
                             f"{fmt(where, 'd')} | {t['new_tokens']} |")  # fmt: skip
    if not lines:
        return ""
    head = ["| method | question | turn | first differing token | new tokens |",
            "|---|---|---:|---:|---:|"]  # fmt: skip
    return "\n".join([f"Outputs that differ from {baseline}'s:", "", *head, *lines])


def lanes_label(lanes: int | list[int]) -> str:
    """How many requests shared the machine (--shard I/N: N lanes side by side); 1 lane = one
    request with the whole machine. A list: the counts a resumed run's questions ran with."""
    counts = sorted(set(lanes)) if isinstance(lanes, list) else [lanes]
    if counts == [1]:
        return "one request at a time"
    return f"{'/'.join(map(str, counts))} lanes side by side"


def markdown(rows: list[dict], settings: dict) -> str:
    """The summary table; with a column "τ by N mod k" when some row has `tau_by_phase`, and
    outside float32 one with the median tokens before an output first differs (`same_prefix`)."""
    phases = any(r["tau_by_phase"] is not None for r in rows)
    prefix = settings.get("dtype", "float32") != "float32"
    head = (
        f"{settings['bench']}: {settings['questions']} questions, {settings['turns']} turn(s), "
        f"max {settings['max_new_tokens']} new tokens; target {settings['target']['name']} "
        f"({settings['dtype']}, {settings['device']}, {settings['threads']} threads, "
        f"{lanes_label(settings.get('lanes', 1))}); "
        f"tau with the bonus token; speedup over hf_greedy (mean tok/s ratio)"
    )
    lines = [
        head,
        "",
        f"| method | category | prompts | τ | α | tok/s | speedup | {agreement_header(settings)} |"
        + (" same tokens before a difference, median |" if prefix else "")
        + (" τ by N mod k |" if phases else ""),
        "|---|---|---:|---:|---:|---:|---:|---|"
        + ("---:|" if prefix else "")
        + ("---|" if phases else ""),
    ]
    for r in rows:
        if r["lossless"] is None:
            lossless = "-"
        else:
            lossless = (
                f"{'yes' if r['lossless'] else 'NO'} ({r['lossless_prompts']}/{r['prompts']})"
            )
        lines.append(
            f"| {r['method']} | {r['category']} | {r['prompts']} | {fmt(r['tau'], '.2f')} | "
            f"{fmt(r['alpha'], '.2f')} | {fmt(r['tokens_per_s'], '.1f')} | "
            f"{fmt(r['speedup'], '.2f')}x | {lossless} |"
            + (f" {fmt(r.get('same_prefix'), 'g')} |" if prefix else "")
            + (f" {_phase_cell(r['tau_by_phase'])} |" if phases else "")
        )
    return "\n".join(lines)


def category_grid(rows: list[dict]) -> str:
    """Speedup (τ) per method and category, one row per method: summarize's rows as a grid."""
    categories = list(dict.fromkeys(r["category"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["category"]): r for r in rows}
    lines = [
        "| method | " + " | ".join(categories) + " |",
        "|---|" + "---:|" * len(categories),
    ]
    for m in methods:
        cells = []
        for c in categories:
            r = cell.get((m, c))
            if r is None:
                cells.append("")
                continue
            tau = f" ({fmt(r['tau'], '.2f')})" if r["tau"] is not None else ""
            cells.append(f"{fmt(r['speedup'], '.2f')}x{tau}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_speedup(rows: list[dict], path: Path, baseline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = list(dict.fromkeys(r["category"] for r in rows))
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != baseline]
    value = {(r["method"], r["category"]): r["speedup"] for r in rows}
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(3 + max(4.0, 0.35 * len(categories) * max(1, len(methods))), 4))
    for i, m in enumerate(methods):
        xs = [c + (i - (len(methods) - 1) / 2) * width for c in range(len(categories))]
        ys = [value.get((m, cat)) or 0.0 for cat in categories]
        ax.bar(xs, ys, width, label=m)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label=baseline)
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_ylabel(f"speedup over {baseline}")
    ax.set_title("speedup by category")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accept_lengths(records: list[dict], methods: list[str], path: Path) -> None:
    """Per drafter method: the share of verification forwards that accepted a draft tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hists = {}
    for m in methods:
        total: list[int] = []
        for r in records:
            if r["method"] != m:
                continue
            for t in r["turns"]:
                h = t.get("accept_hist", [])
                total += [0] * (len(h) - len(total))
                for a, c in enumerate(h):
                    total[a] += c
        hists[m] = total
    n = max(len(hists), 1)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3), squeeze=False)
    for ax, (m, h) in zip(axes[0], hists.items(), strict=False):
        s = sum(h) or 1
        ax.bar(range(len(h)), [c / s for c in h])
        ax.set_xticks(range(max(len(h), 2)))
        ax.set_xlim(-0.5, max(len(h), 2) - 0.5)
        ax.set_title(m, fontsize="small")
        ax.set_xlabel("accepted draft tokens per forward")
    axes[0][0].set_ylabel("share of verification forwards")
    fig.suptitle("accepted draft tokens per verification forward (a gate's AR steps count 0)",
                 fontsize="medium")  # fmt: skip
    if not hists:
        axes[0][0].text(0.5, 0.5, "no drafter method", ha="center", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(
    out: Path, settings: dict, methods: dict, records: list[dict], baseline: str
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(records, list(methods), baseline)
    md = markdown(rows, settings)
    diff = divergences(records, baseline)
    md = md + ("\n\n" + diff if diff else "")
    result = {"settings": settings, "methods": methods, "summary": rows, "records": records}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text(md + "\n")
    plot_speedup(rows, out / "speedup_by_category.png", baseline)
    drafter_methods = [m for m, i in methods.items() if i["kind"] not in ("hf", "ar")]
    plot_accept_lengths(records, drafter_methods, out / "accept_lengths.png")
    files = ["results.json", "results.md", "speedup_by_category.png", "accept_lengths.png"]
    return {**result, "markdown": md, "files": files}
