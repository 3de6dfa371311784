"""What a benchmark table says of the papers' claims and of results v2's goals (issue 20), from
one table's "all" rows (`drafters.eval.report.summarize`): the numbers behind each claim, and each
goal met, or missed by how much. benchmarks/results_report.py writes both into docs/results.md.
"""

from __future__ import annotations

from drafters.eval.report import fmt


def claim_lines(rows: list[dict]) -> list[str]:
    """The numbers behind each paper claim, from one table's "all" rows."""
    by = {r["method"]: r for r in rows}

    def cell(m):
        r = by.get(m)
        return (
            "not measured"
            if r is None
            else (f"τ {fmt(r['tau'])}, {fmt(r['speedup'])}x, {fmt(r['tokens_per_s'], '.1f')} tok/s")
        )

    def ratio(a, b, key):
        ra, rb = by.get(a), by.get(b)
        if not ra or not rb or ra[key] is None or rb[key] is None or not rb[key]:
            return "-"
        return f"{ra[key] / rb[key]:.2f}"

    return [
        f"- Falcon vs Medusa and the peers: falcon_k2 {cell('falcon_k2')}; medusa "
        f"{cell('medusa')}; hf_prompt_lookup {cell('hf_prompt_lookup')}; hf_early_exit "
        f"{cell('hf_early_exit')}. Falcon/Medusa speedup ratio "
        f"{ratio('falcon_k2', 'medusa', 'speedup')}.",
        f"- CSGD over teacher forcing: falcon_k2 {cell('falcon_k2')}; falcon_k2_tf "
        f"{cell('falcon_k2_tf')}; τ ratio {ratio('falcon_k2', 'falcon_k2_tf', 'tau')} (paper: "
        f"3.34 / 2.78 = 1.20).",
        f"- k=2 vs k=3: falcon_k2 {cell('falcon_k2')}; falcon_k3 {cell('falcon_k3')}; speedup "
        f"ratio {ratio('falcon_k2', 'falcon_k3', 'speedup')}.",
        f"- Cerberus heads vs Medusa heads (no gate): cerberus {cell('cerberus')}; medusa "
        f"{cell('medusa')}; speedup ratio {ratio('cerberus', 'medusa', 'speedup')} (paper: "
        f"1.10-1.30).",
        f"- Cerberus with its gate vs Medusa: speedup ratio "
        f"{ratio('cerberus+entropy', 'medusa', 'speedup')} (entropy gate), "
        f"{ratio('cerberus+learned', 'medusa', 'speedup')} (learned gate).",
        f"- The gate: cerberus+entropy {cell('cerberus+entropy')}; cerberus+learned "
        f"{cell('cerberus+learned')}; cerberus without gate {cell('cerberus')}.",
    ]


# Results v2's goals (fp32, lossless on every turn): (what, measured, target); measured(drafters'
# rows, peers' rows) by method, from a table's "all" rows, is (value, the method it comes from)
# or None when a method is missing.
# The Falcon goals are the drafter's: hybrid trees (n-gram candidates from the context merged into
# the drafter's tree, what prompt lookup drafts) count only for the best drafter, and that goal is
# judged without them too.
GOALS = (
    ("Falcon τ", lambda by, peers: _best(by, "tau", "falcon", ngrams=False), 3.0),
    ("Falcon speedup over HF greedy", lambda by, peers: _best(
        by, "speedup", "falcon", ngrams=False), 1.6),
    ("best drafter over HF prompt lookup", lambda by, peers: _over(
        peers, _best(by, "speedup", ""), "hf_prompt_lookup", "speedup"), 1.3),
    ("best drafter without n-gram candidates over HF prompt lookup", lambda by, peers: _over(
        peers, _best(by, "speedup", "", ngrams=False), "hf_prompt_lookup", "speedup"), 1.3),
    ("Cerberus heads over Medusa heads, no gate", lambda by, peers: _over(
        by, _get(by, "cerberus", "speedup"), "medusa", "speedup"), 1.1),
    ("decode-faithful CSGD τ over teacher forcing", lambda by, peers: _over(
        by, _get(by, "falcon_k2", "tau"), "falcon_k2_tf", "tau"), 1.1),
)  # fmt: skip


def _get(by: dict, method: str, key: str):
    r = by.get(method)
    return None if r is None or r[key] is None else (r[key], method)


def _best(by: dict, key: str, prefix: str, ngrams: bool = True):
    """The lossless drafter method starting with prefix with the highest `key` (`by` holds the
    drafters' rows only); ngrams=False leaves out the hybrid trees (`<drafter>+hybrid[n]`)."""
    cands = [r for m, r in by.items() if m.startswith(prefix) and r["lossless"]
             and r[key] is not None and (ngrams or "hybrid" not in m)]  # fmt: skip
    r = max(cands, key=lambda r: r[key], default=None)
    return None if r is None else (r[key], r["method"])


def _over(by: dict, num, den_method: str, key: str):
    den = _get(by, den_method, key)
    if num is None or den is None or not den[0]:
        return None
    return num[0] / den[0], f"{num[1]} / {den_method}"


def goal_lines(rows: list[dict], drafters: list[str]) -> list[str]:
    """Each goal of results v2 against one table's "all" rows: met, or missed by how much.
    drafters: the drafter methods (the rest are peers). Only lossless drafters count for the
    best-of goals; a ratio names the methods it divides."""
    by = {r["method"]: r for r in rows if r["method"] in drafters}
    peers = {r["method"]: r for r in rows if r["method"] not in drafters}
    lossy = [m for m, r in by.items() if r["lossless"] is False]
    lines = ["| goal | measured | from | target | verdict |", "|---|---:|---|---:|---|"]
    for what, measure, target in GOALS:
        got = measure(by, peers)
        if got is None:
            lines.append(f"| {what} | - | not measured | {target} | cannot be judged |")
            continue
        value, source = got
        verdict = "met" if value >= target else f"missed by {1 - value / target:.0%}"
        lines.append(f"| {what} | {value:.2f} | {source} | {target} | {verdict} |")
    if lossy:
        lines += ["", f"Not lossless on every turn, so left out of the best-of goals: "
                      f"{', '.join(lossy)}."]  # fmt: skip
    return lines
