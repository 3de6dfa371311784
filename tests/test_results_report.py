"""docs/results.md generation: generated blocks are replaced in place, written text around them
stays, and a benchmark still running is reported with the questions it covers."""

import json

from train_helpers import load_script

# a repository script, not part of the package
results_report = load_script("benchmarks/results_report.py")
bench_tables, fill = results_report.bench_tables, results_report.fill


def test_fill_replaces_only_generated_blocks():
    doc = "# R\n\nwritten by hand\n<!-- generated:a -->\nold\n<!-- /generated -->\nafter\n"
    out = fill(doc, {"a": ["new 1", "new 2"], "b": ["appended"]})
    assert "old" not in out and "new 1\nnew 2\n<!-- /generated -->\nafter" in out
    assert out.startswith("# R\n\nwritten by hand\n")
    assert out.rstrip().endswith("<!-- generated:b -->\nappended\n<!-- /generated -->")
    assert fill(out, {"a": ["new 1", "new 2"], "b": ["appended"]}) == out


def test_partial_benchmark_is_labelled(tmp_path):
    folder = tmp_path / "bench"
    (folder / "records").mkdir(parents=True)
    settings = {"bench": "mt_bench", "questions": 2, "question_ids": [1, 2], "turns": 2,
                "max_new_tokens": 8, "target": {"name": "t"}, "dtype": "float32",
                "device": "cpu", "threads": 1}  # fmt: skip
    info = {"hf_greedy": {"kind": "hf"}, "ar": {"kind": "ar"}}
    (folder / "run.json").write_text(json.dumps({"settings": settings, "methods": info}))
    turn = {"new_tokens": 8, "seconds": 1.0, "verify_forwards": 7, "accepted_tokens": 0,
            "lossless": True}  # fmt: skip
    recs = [{"question_id": 1, "category": "c", "method": m, "new_tokens": 16, "seconds": 2.0,
             "tokens_per_s": 8.0, "lossless": True, "turns": [dict(turn), dict(turn)]}
            for m in info]  # fmt: skip
    (folder / "records" / "x.jsonl").write_text(json.dumps({"question_id": 1, "records": recs}))
    lines, rows = bench_tables(folder, tmp_path / "fig", "mt_bench")
    assert lines[0].startswith("Questions measured: 1 of 2 (the run is still going")
    assert rows["complete"] is False
    assert [r["method"] for r in rows["first"]] == ["hf_greedy", "ar"]
    assert rows["first"][1]["tau"] == 1.0 and rows["first"][0]["speedup"] == 1.0
    grid = next(x for x in lines if x.startswith("| method | c | all |")).splitlines()
    assert grid[2:] == [f"| {m} | 1.00x (1.00) | 1.00x (1.00) |" for m in ("hf_greedy", "ar")]
