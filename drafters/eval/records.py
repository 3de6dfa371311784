"""The benchmark's records: what makes a long `drafters-bench` run resumable and
shardable. --out/run.json holds the run's settings and methods; --out/records/*.jsonl one line
per finished question (every method's record), one file per process; each record marked lossless
against the baseline's output (`mark_lossless`)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from drafters.io_utils import create_exclusive

BASELINE = "hf_greedy"


def first_divergence(ids: list[int], ref: list[int]) -> int | None:
    """The index of the first token where `ids` leaves `ref` (a shorter or longer output leaves
    it where it ends); None if equal."""
    if ids == ref:
        return None
    return next((i for i, (a, b) in enumerate(zip(ids, ref, strict=False)) if a != b),
                min(len(ids), len(ref)))  # fmt: skip


def mark_lossless(records: list[dict]) -> None:
    """Per turn and per question: equal to hf_greedy's output token for token (None without
    the baseline), and per turn where it first differs (`first_divergence`). Drops the token
    ids afterwards (the JSON keeps the decoded answers)."""
    ref = next((r for r in records if r["method"] == BASELINE), None)
    for r in records:
        for i, t in enumerate(r["turns"]):
            base = None if ref is None else ref["turns"][i]["_ids"]
            t["lossless"] = None if base is None else t["_ids"] == base
            t["first_divergence"] = None if base is None else first_divergence(t["_ids"], base)
        r["lossless"] = None if ref is None else all(t["lossless"] for t in r["turns"])
    for r in records:
        for t in r["turns"]:
            t.pop("_ids")


class RecordStore:
    """--out/run.json (the run's settings and methods) and --out/records/*.jsonl (one line per
    question: every method's record). A restart, or another shard, with other settings is
    refused; a line cut by a kill is dropped (that question runs again), and counted."""

    # may differ between shards and restarts; eval_file is a path (another checkout, another
    # machine), the file's content is eval_sha256
    VOLATILE = ("warmup_questions", "machine", "torch", "transformers", "eval_file", "lanes")

    def __init__(self, folder: Path, settings: dict, methods: dict) -> None:
        self.folder = folder
        (folder / "records").mkdir(parents=True, exist_ok=True)
        run_file = folder / "run.json"
        mine = {"settings": settings, "methods": methods}
        if not run_file.is_file():
            # Shards start together: the first shard's run.json wins; every shard, the first
            # included, is then checked against it.
            create_exclusive(run_file, json.dumps(mine, indent=1))
        theirs = json.loads(run_file.read_text())
        differ = _differences(mine, theirs, self.VOLATILE)
        if differ:
            raise ValueError(
                f"{run_file}: this run's settings differ from the recorded run's in "
                f"{', '.join(differ)}; use another --out, or delete {folder} to start over"
            )
        # each line names its machine: a run resumed elsewhere (a replaced machine) mixes them
        self.machine = settings.get("machine")
        self.path = folder / "records" / f"{platform.node()}-{os.getpid()}.jsonl"
        if self.path.is_file() and not self.path.read_bytes().endswith(b"\n"):
            with open(self.path, "a") as f:  # a line cut by a kill: end it, keep it apart
                f.write("\n")

    def done(self) -> set:
        return set(read_records(self.folder)[0])

    def append(self, question_id, batch: list[dict]) -> None:
        line = json.dumps({"question_id": question_id, "machine": self.machine, "records": batch})
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def _differences(a: dict, b: dict, volatile: tuple[str, ...], prefix: str = "") -> list[str]:
    keys = [k for k in dict.fromkeys([*a, *b]) if k not in volatile]
    out = []
    for k in keys:
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, volatile, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}")
    return out


def _first_rows(folder: Path) -> tuple[dict, int]:
    """{question_id: its line's row} over every records file (the first line of a question wins),
    and the number of unreadable lines (cut by a kill)."""
    rows: dict = {}
    bad = 0
    for path in sorted((folder / "records").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            rows.setdefault(row["question_id"], row)
    return rows, bad


def read_records(folder: Path) -> tuple[dict, int]:
    """{question_id: [records]} from every records file (first one wins), and the number of
    unreadable lines (cut by a kill)."""
    rows, bad = _first_rows(folder)
    return {q: row["records"] for q, row in rows.items()}, bad


def question_machines(folder: Path) -> dict:
    """{question_id: the machine that ran it} (first record of a question wins, as in
    read_records); lines written before records named their machine count under run.json's."""
    run_file = folder / "run.json"
    default = (
        json.loads(run_file.read_text())["settings"].get("machine") if run_file.is_file() else None
    )
    return {
        q: row.get("machine") or default or "unknown" for q, row in _first_rows(folder)[0].items()
    }


def merge(folder: Path) -> dict:
    """Reports from the records under folder, once every question has been run."""
    from drafters.eval.report import write_reports

    run_file = folder / "run.json"
    if not run_file.is_file():
        raise ValueError(f"{run_file} does not exist: run the benchmark with --out {folder} first")
    run_info = json.loads(run_file.read_text())
    settings, info = run_info["settings"], run_info["methods"]
    by_question, bad = read_records(folder)
    if bad:
        print(f"[bench] {bad} cut record lines skipped (run again)", file=sys.stderr)
    ids = settings["question_ids"]
    missing = [q for q in ids if q not in by_question]
    if missing:
        msg = f"{len(ids) - len(missing)} of {len(ids)} questions recorded in {folder}"
        print(f"[bench] {msg}; reports when all are (rerun the shards)", file=sys.stderr)
        return {"complete": False, "markdown": msg, "files": []}
    records = [r for q in ids for r in by_question[q]]
    settings = {
        **settings,
        "lanes": sorted({r.get("lanes", settings.get("lanes", 1)) for r in records}),
    }
    return {"complete": True, **write_reports(folder, settings, info, records, BASELINE)}
