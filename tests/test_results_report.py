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


def test_scaling_curve_block_reads_the_committed_rows_in_order(tmp_path):
    def row(kind, tokens, vocab, tau):
        return {"run": f"scaling_{kind}_{tokens}" + (f"_v{vocab}" if vocab != 8192 else ""),
                "kind": kind, "train_answer_tokens": tokens, "global_step": 700,
                "draft_vocab": {"size": vocab, "coverage_validation": 0.9}, "epochs": 10.0,
                "ended_by": "max_epochs", "precision": "bf16-mixed", "machine": "CPU (avx2)",
                "prompts": 20, "tree": "chain4", "tau": tau, "train_tokens_per_s": 700.0,
                "accept_at_depth": [0.25, 0.05, 0.02, 0.01]}  # fmt: skip

    for r in (row("medusa", 990_000, 8192, 1.5), row("falcon", 99_000, 8192, 1.3),
              row("medusa", 99_000, 4096, 1.33), row("medusa", 99_000, 8192, 1.35)):  # fmt: skip
        (tmp_path / f"{r['run']}.json").write_text(json.dumps(r))
    (tmp_path / "other.json").write_text("{}")  # not a scaling row
    lines = results_report.scaling_lines(tmp_path)
    runs = [ln.split(" | ")[0][2:] for ln in lines if ln.startswith("| scaling_")]
    assert runs == ["scaling_falcon_99000", "scaling_medusa_99000_v4096", "scaling_medusa_99000",
                    "scaling_medusa_990000"]  # fmt: skip
    medusa = next(ln for ln in lines if ln.startswith("| scaling_medusa_99000 |"))
    assert "| 700 (bf16) | 700 (10.0 ep, epochs) | 1.350 | 0.250 |" in medusa
    assert lines[-1] == "trained on: CPU (avx2)"
    assert results_report.scaling_lines(tmp_path / "none")[0].startswith("No run decoded yet")


def test_a_table_not_run_yet_replaces_an_earlier_runs_claims_and_goals(tmp_path):
    out = tmp_path / "results.md"
    stale = "<!-- generated:{} -->\n- an earlier recipe's verdict\n<!-- /generated -->\n"
    out.write_text(
        "# R\n" + "".join(stale.format(b) for b in ("claims_spec_bench", "goals_mt_bench"))
    )
    results_report.build(tmp_path / "results", out, tmp_path / "logs", tmp_path / "data",
                         scaling=tmp_path / "scaling")  # fmt: skip
    doc = out.read_text()
    assert "earlier recipe" not in doc
    assert "No question of spec_bench measured yet." in doc
    assert "No question of mt_bench measured yet." in doc


def test_a_table_mixing_machines_shows_each_machines_speedups(tmp_path):
    folder = tmp_path / "bench"
    (folder / "records").mkdir(parents=True)
    settings = {"bench": "mt_bench", "questions": 2, "question_ids": [1, 2], "turns": 1,
                "max_new_tokens": 8, "target": {"name": "t"}, "dtype": "float32",
                "device": "cpu", "threads": 2, "machine": "x"}  # fmt: skip
    info = {"hf_greedy": {"kind": "hf"}, "ar": {"kind": "ar"}}
    (folder / "run.json").write_text(json.dumps({"settings": settings, "methods": info}))

    def line(q, machine, ar_seconds):
        turn = {"new_tokens": 8, "verify_forwards": 7, "accepted_tokens": 0, "lossless": True}
        recs = [{"question_id": q, "category": "c", "method": m, "new_tokens": 8, "seconds": s,
                 "tokens_per_s": 8 / s, "lossless": True, "turns": [{**turn, "seconds": s}]}
                for m, s in (("hf_greedy", 1.0), ("ar", ar_seconds))]  # fmt: skip
        return json.dumps({"question_id": q, "machine": machine, "records": recs}) + "\n"

    (folder / "records" / "a.jsonl").write_text(line(1, "x", 0.5) + line(2, "y", 2.0))
    lines, _ = bench_tables(folder, tmp_path / "fig", "mt_bench")
    assert "Measured on x (1 questions); y (1 questions)" in lines[0]
    grid = next(x for x in lines if x.startswith("| method | x | y | all |")).splitlines()
    assert grid[3] == "| ar | 2.00x (1.00) | 0.50x (1.00) | 1.25x (1.00) |"


def test_overlap_compares_the_questions_two_tables_share(tmp_path):
    info = {"hf_greedy": {"kind": "hf"}, "ar": {"kind": "ar"}}

    def table(tag, questions, scale, ar_answer="a"):
        folder = tmp_path / tag
        (folder / "records").mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"settings": {}, "methods": info}))
        lines = []
        for q in questions:
            recs = [{"question_id": q, "category": "c", "method": m, "new_tokens": 8,
                     "seconds": s / scale, "tokens_per_s": 8 * scale / s, "lossless": True,
                     "turns": [{"new_tokens": 8, "seconds": s / scale, "answer": ans}]}
                    for m, s, ans in (("hf_greedy", 1.0, "a"), ("ar", 0.5, ar_answer))]  # fmt: skip
            lines.append(json.dumps({"question_id": q, "records": recs}) + "\n")
        (folder / "records" / "x.jsonl").write_text("".join(lines))

    assert results_report.overlap_lines(tmp_path)[0].startswith("Not both tables run yet")
    table("mt_bench", [1, 2, 3], 1.0)
    table("spec_bench", [2, 9], 0.5, ar_answer="b")  # a slower machine, another ar output
    lines = results_report.overlap_lines(tmp_path)
    assert lines[0] == "The 1 questions in both the mt_bench and the spec_bench table (all turns):"
    assert lines[4] == "| hf_greedy | 8.0 | 4.0 | 0.50 | 1.00x | 1.00x | 1/1 |"
    assert lines[5] == "| ar | 16.0 | 8.0 | 0.50 | 2.00x | 2.00x | 0/1 |"
