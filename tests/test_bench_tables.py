"""The benchmark blocks of docs/results.md (drafters.eval.bench_tables): a run still going is
reported with the questions it covers, a table mixing machines shows each machine's speedups,
and two tables' shared questions are compared run against run."""

import json

from drafters.eval.bench_tables import bench_tables, overlap_lines


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
             "tokens_per_s": 8.0, "lossless": True,
             "turns": [{**turn, "prompt_tokens": 5}, {**turn, "prompt_tokens": 20}]}
            for m in info]  # fmt: skip
    (folder / "records" / "x.jsonl").write_text(json.dumps({"question_id": 1, "records": recs}))
    lines, rows = bench_tables(folder, tmp_path / "fig", "mt_bench")
    assert lines[0].startswith("Questions measured: 1 of 2 (the run is still going")
    assert rows["complete"] is False
    assert [r["method"] for r in rows["first"]] == ["hf_greedy", "ar"]
    assert rows["first"][1]["tau"] == 1.0 and rows["first"][0]["speedup"] == 1.0
    grid = next(x for x in lines if x.startswith("| method | c | all |")).splitlines()
    assert grid[2:] == [f"| {m} | 1.00x (1.00) | 1.00x (1.00) |" for m in ("hf_greedy", "ar")]
    assert "Prompt tokens, median (first turns / later turns): c 5 / 20." in lines


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
        settings = {"bench": tag, "questions": len(questions), "question_ids": questions,
                    "turns": 1, "max_new_tokens": 8, "target": {"name": "t"},
                    "dtype": "float32", "device": "cpu", "threads": 2}  # fmt: skip
        (folder / "run.json").write_text(json.dumps({"settings": settings, "methods": info}))
        lines = []
        for q in questions:
            recs = [{"question_id": q, "category": "c", "method": m, "new_tokens": 8,
                     "seconds": s / scale, "tokens_per_s": 8 * scale / s, "lossless": True,
                     "turns": [{"new_tokens": 8, "seconds": s / scale, "answer": ans,
                                "lossless": True}]}
                    for m, s, ans in (("hf_greedy", 1.0, "a"), ("ar", 0.5, ar_answer))]  # fmt: skip
            lines.append(json.dumps({"question_id": q, "records": recs}) + "\n")
        (folder / "records" / "x.jsonl").write_text("".join(lines))
        return bench_tables(folder, tmp_path / "fig", tag)[1]

    tables = {"mt_bench": table("mt_bench", [1, 2, 3], 1.0)}
    assert overlap_lines(tables)[0].startswith("Not both tables run yet")
    tables["spec_bench"] = table("spec_bench", [2, 9], 0.5, ar_answer="b")  # slower, other output
    assert sorted(tables["spec_bench"]["by_question"]) == [2, 9]
    lines = overlap_lines(tables)
    assert lines[0] == "The 1 questions in both the mt_bench and the spec_bench table (all turns):"
    assert lines[4] == "| hf_greedy | 8.0 | 4.0 | 0.50 | 1.00x | 1.00x | 1/1 |"
    assert lines[5] == "| ar | 16.0 | 8.0 | 0.50 | 2.00x | 2.00x | 0/1 |"
