"""docs/results.md generation: generated blocks are replaced in place, written text around them
stays, and a table not run yet replaces an earlier run's verdicts (the benchmark tables'
blocks: tests/test_bench_tables.py)."""

import json

from train_helpers import load_script

# a repository script, not part of the package
results_report = load_script("benchmarks/results_report.py")
fill = results_report.fill


def test_fill_replaces_only_generated_blocks():
    doc = "# R\n\nwritten by hand\n<!-- generated:a -->\nold\n<!-- /generated -->\nafter\n"
    out = fill(doc, {"a": ["new 1", "new 2"], "b": ["appended"]})
    assert "old" not in out and "new 1\nnew 2\n<!-- /generated -->\nafter" in out
    assert out.startswith("# R\n\nwritten by hand\n")
    assert out.rstrip().endswith("<!-- generated:b -->\nappended\n<!-- /generated -->")
    assert fill(out, {"a": ["new 1", "new 2"], "b": ["appended"]}) == out


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
