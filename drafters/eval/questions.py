"""The benchmark prompts: Spec-Bench style jsonl files (MT-Bench and Spec-Bench ship in
prompts/, with their sources and licences in prompts/README.md), read with every problem named by
file and line, and sampled per category."""

from __future__ import annotations

import json
import random
from pathlib import Path

MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)  # fmt: skip
# MT-Bench and Spec-Bench, shipped inside the package (prompts/README.md: sources, licences)
EVAL_DIR = Path(__file__).resolve().parent / "prompts"


def read_questions(path: Path) -> list[dict]:
    """A prompt file in the Spec-Bench format: one JSON object a line with `question_id`,
    `category` and `turns` (a list of user messages). Any problem names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    rows, ids = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f'{path}:{n}: needs "turns": a non-empty list of strings')
        if "question_id" not in row or not isinstance(row.get("category"), str):
            raise ValueError(f'{path}:{n}: needs "question_id" and a "category" string')
        if row["question_id"] in ids:
            raise ValueError(f"{path}:{n}: question_id {row['question_id']!r} appears twice")
        ids.add(row["question_id"])
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no questions")
    return rows


def load_questions(path: Path, bench: str, per_category: int | None, seed: int) -> list[dict]:
    """Rows of a Spec-Bench style jsonl; in spec_bench the MT-Bench categories are pooled into
    one category "mt_bench" (Spec-Bench's multi-turn conversation). per_category: a seeded
    sample of that many questions per category, kept in file order."""
    rows = read_questions(path)
    for r in rows:
        if bench == "spec_bench" and r["category"] in MT_BENCH_CATEGORIES:
            r["category"] = "mt_bench"
    if per_category is not None:
        rng = random.Random(seed)
        by_cat: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_cat.setdefault(r["category"], []).append(i)
        keep = {i for idx in by_cat.values() for i in rng.sample(idx, min(per_category, len(idx)))}
        rows = [r for i, r in enumerate(rows) if i in keep]
    return rows
