"""The blocks docs/results.md shows for benchmark folders (`drafters-bench --out DIR`): one
folder's tables, complete or partial (a run still going is labelled with the questions it covers),
its speedups per machine when a resumed run mixes machines, and the questions two tables share
compared run against run. benchmarks/results_report.py writes them between the document's
generated markers.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from statistics import median

from drafters.eval.records import BASELINE, question_machines, read_records
from drafters.eval.report import (
    category_grid,
    fmt,
    markdown,
    plot_accept_lengths,
    plot_speedup,
    summarize,
)


def first_turn(record: dict) -> dict:
    """A record cut to its first turn (the first-turn table)."""
    t = record["turns"][0]
    return {**record, "turns": [t], "new_tokens": t["new_tokens"], "seconds": t["seconds"],
            "tokens_per_s": t["new_tokens"] / t["seconds"] if t["seconds"] else float("nan"),
            "lossless": t["lossless"]}  # fmt: skip


def bench_tables(folder: Path, fig_dir: Path, tag: str) -> tuple[list[str], dict]:
    """(markdown lines, table) of one benchmark folder, complete or partial. table: {} before
    any record; else "all" and "first" (summarize's "all" rows, all turns and first turns),
    "complete", "drafters" (its drafter methods), "methods" (all of them, in run order) and
    "by_question" ({question_id: records} of the questions the rows cover). Plots go to
    fig_dir/{tag}_speedup.png and {tag}_accept_lengths.png."""
    run_file = folder / "run.json"
    if not run_file.is_file():
        return [f"Not run yet (`benchmarks/results.sh bench` writes {folder})."], {}
    run = json.loads(run_file.read_text())
    settings, info = run["settings"], run["methods"]
    by_q, _ = read_records(folder)
    ids = [q for q in settings["question_ids"] if q in by_q]
    records = [r for q in ids for r in by_q[q]]
    methods = list(info)
    total = settings["questions"]
    complete = len(ids) == total
    head = f"Questions measured: {len(ids)} of {total}"
    head += "." if complete else " (the run is still going; every number below covers only these)."
    where = question_machines(folder)
    made_on = Counter(where[q] for q in ids)
    if len(made_on) > 1:  # resumed on a replaced machine: every question's methods ran on one
        head += " Measured on " + "; ".join(f"{m} ({n} questions)" for m, n in made_on.items())
        head += ": each question's methods ran together on one machine (per machine: below)."
    if not records:
        return [head], {}
    rows_all = summarize(records, methods, BASELINE)
    rows_first = summarize([first_turn(r) for r in records], methods, BASELINE)
    fig_dir.mkdir(parents=True, exist_ok=True)
    plot_speedup(rows_all, fig_dir / f"{tag}_speedup.png", BASELINE)
    drafters = [m for m, i in info.items() if i["kind"] not in ("hf", "ar")]
    plot_accept_lengths(records, drafters, fig_dir / f"{tag}_accept_lengths.png")
    overall = [r for r in rows_all if r["category"] == "all"]
    first = [r for r in rows_first if r["category"] == "all"]
    settings = {**settings, "questions": len(ids)}  # the questions these rows cover
    full_table = f"`{folder}/results.md`"
    if not complete:
        full_table += " (written once the run is complete)"
    lines = [head, "", "All turns, all categories:", "", markdown(overall, settings), "",
             "First turns only:", "", markdown(first, {**settings, "turns": 1}), "",
             "Per category, all turns: speedup over HF greedy (τ). The same rows with α, tok/s "
             f"and lossless: {full_table}.", "",
             category_grid(rows_all), "",
             *prompt_lengths(records),
             *machine_grid(where, records, methods),
             f"![speedup by category](results/{tag}_speedup.png)",
             f"![accepted lengths](results/{tag}_accept_lengths.png)"]  # fmt: skip
    table = {"all": overall, "first": first, "complete": complete, "drafters": drafters,
             "methods": methods, "by_question": {q: by_q[q] for q in ids}}  # fmt: skip
    return lines, table


def prompt_lengths(records: list[dict]) -> list[str]:
    """The median prompt length per category, first turns and later turns (the chat so far),
    from the baseline's records: long prompts make every verification forward dearer."""
    base = [r for r in records if r["method"] == BASELINE]
    if not base or any("prompt_tokens" not in t for r in base for t in r["turns"]):
        return []
    cells = []
    for cat in dict.fromkeys(r["category"] for r in base):
        turns = [r["turns"] for r in base if r["category"] == cat]
        first = median(t[0]["prompt_tokens"] for t in turns)
        later = [t["prompt_tokens"] for ts in turns for t in ts[1:]]
        cells.append(f"{cat} {first:g}" + (f" / {median(later):g}" if later else ""))
    multi = any(len(r["turns"]) > 1 for r in base)
    what = "first turns / later turns" if multi else "first turns"
    return [f"Prompt tokens, median ({what}): " + "; ".join(cells) + ".", ""]


def machine_grid(where: dict, records: list[dict], methods: list[str]) -> list[str]:
    """Where a table mixes machines: speedup over HF greedy (τ) per method on each machine's
    questions, all turns. What a drafter gains over HF greedy depends on the machine as much as on
    the drafter (docs/measurements.md), so the pooled rows alone would hide it. where: {question:
    machine} (`question_machines`)."""
    if len({where[r["question_id"]] for r in records}) < 2:
        return []
    by_machine = [{**r, "category": where[r["question_id"]]} for r in records]
    return ["Per machine, all turns: speedup over HF greedy (τ) on the questions each ran.", "",
            category_grid(summarize(by_machine, methods, BASELINE)), ""]  # fmt: skip


def overlap_lines(tables: dict[str, dict], a: str = "mt_bench", b: str = "spec_bench") -> list[str]:
    """The questions two fp32 tables share (Spec-Bench's mt_bench category is 10 MT-Bench
    questions), method by method: the rate and speedup each run measured and how many outputs are
    the same. Rates that move while speedups and outputs stay say the machine changed between the
    runs, not the drafters. tables: {tag: bench_tables' table}."""
    if not tables.get(a) or not tables.get(b):
        return [f"Not both tables run yet ({a}, {b})."]
    recs = {tag: tables[tag]["by_question"] for tag in (a, b)}
    methods = [m for m in tables[a]["methods"] if m in tables[b]["methods"]]
    shared = sorted(set(recs[a]) & set(recs[b]))
    if not shared:
        return [f"No question in both {a} and {b} yet."]
    rows = {
        tag: {
            r["method"]: r
            for r in summarize([r for q in shared for r in recs[tag][q]], methods, BASELINE)
            if r["category"] == "all"
        }
        for tag in (a, b)
    }

    def answers(tag: str, q, method: str) -> list:
        return [t.get("answer") for r in recs[tag][q] if r["method"] == method for t in r["turns"]]

    lines = [f"The {len(shared)} questions in both the {a} and the {b} table (all turns):", "",
             f"| method | tok/s, {a} run | tok/s, {b} run | rate, {b} / {a} | speedup, {a} run "
             f"| speedup, {b} run | same outputs |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for m in methods:
        ra, rb = rows[a].get(m), rows[b].get(m)
        if ra is None or rb is None:
            continue
        same = sum(answers(a, q, m) == answers(b, q, m) for q in shared)
        lines.append(
            f"| {m} | {fmt(ra['tokens_per_s'], '.1f')} | {fmt(rb['tokens_per_s'], '.1f')} | "
            f"{fmt(rb['tokens_per_s'] / ra['tokens_per_s'])} | {fmt(ra['speedup'])}x | "
            f"{fmt(rb['speedup'])}x | {same}/{len(shared)} |"
        )
    return lines
