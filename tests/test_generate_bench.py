"""`drafters-generate` and `drafters-bench` on the tiny target, and one end to
end run on the embedded SmolLM2: distil, train, export, decode == HF greedy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import ROOT, compose_config, tiny_overrides

from drafters.cli import bench_main
from drafters.eval.questions import load_questions
from drafters.export import read_config


def write_eval(folder: Path, name: str = "mt_bench") -> Path:
    """A tiny Spec-Bench style file: 2 categories x 2 two-turn questions."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        (1, "writing", ["Write a line about rain.", "Make it sadder."]),
        (2, "writing", ["Describe a cat.", "Shorter, please."]),
        (3, "math", ["What is 2 + 2?", "And 3 + 3?"]),
        (4, "math", ["Solve x + 1 = 3.", "Check it."]),
    ]
    lines = [json.dumps({"question_id": i, "category": c, "turns": t}) for i, c, t in rows]
    (folder / f"{name}_question.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_question_sampling_is_deterministic(tmp_path):
    path = write_eval(tmp_path) / "mt_bench_question.jsonl"
    a = load_questions(path, "mt_bench", 1, seed=0)
    assert [q["category"] for q in a] == ["writing", "math"]
    assert a == load_questions(path, "mt_bench", 1, seed=0)
    assert len(load_questions(path, "mt_bench", None, 0)) == 4


def test_bench_on_the_tiny_target(tmp_path, tiny_exported, capsys):
    kinds = ["medusa", "cerberus", "falcon"]
    out = tmp_path / "bench"
    argv = [
        "--eval-dir", str(write_eval(tmp_path / "eval")),
        "--per-category", "1",
        "--turns", "2",
        "--max-new-tokens", "16",
        "--threads", "1",
        "--methods", "hf_greedy", "ar", "hf_prompt_lookup", "hf_early_exit", "ngram",
        "--prompt-lookup", "3",
        "--early-exit-layer", "1",
        "--gates", "none", "default", "entropy",
        "--out", str(out),
    ]  # fmt: skip
    own = {"medusa": "@none,budget,dynamic3", "falcon": "@none,hybrid"}  # their own gate lists
    for k in kinds:
        argv += ["--drafter", str(tiny_exported[k]) + own.get(k, "")]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "| method | category |" in printed and "cerberus_tiny+learned" in printed

    for f in ("results.json", "results.md", "speedup_by_category.png", "accept_lengths.png"):
        assert (out / f).stat().st_size > 0, f
    assert (out / "speedup_by_category.png").read_bytes()[:4] == b"\x89PNG"
    res = json.loads((out / "results.json").read_text())
    methods = ["hf_greedy", "ar", "hf_prompt_lookup", "hf_early_exit", "ngram", "medusa_tiny"]
    methods += ["medusa_tiny+budget", "medusa_tiny+dynamic3", "cerberus_tiny"]
    methods += ["cerberus_tiny+learned"]
    methods += ["cerberus_tiny+entropy", "falcon_tiny", "falcon_tiny+hybrid"]
    assert list(res["methods"]) == methods
    assert res["settings"]["threads"] == 1 and res["settings"]["questions"] == 2
    rows = {(r["method"], r["category"]): r for r in res["summary"]}
    assert {c for _, c in rows} == {"writing", "math", "all"}
    assert all(
        r["lossless"] is True and r["lossless_prompts"] == r["prompts"] for r in rows.values()
    )
    assert rows["hf_greedy", "all"]["speedup"] == pytest.approx(1.0)
    assert rows["hf_greedy", "all"]["tau"] is None and rows["ar", "all"]["tau"] == 1.0
    for m in methods[4:]:
        r = rows[m, "all"]
        assert r["tau"] >= 1.0 and 0.0 <= r["alpha"] < 1.0 and r["speedup"] > 0
    # every turn says how many draft nodes each step verified; budget gates vary it
    for r in res["records"]:
        for t in r["turns"]:
            if r["method"].startswith(("hf_", "ar")):
                continue
            assert sum(t["nodes_hist"]) == t["verify_forwards"]
            if r["method"] == "medusa_tiny+dynamic3":  # 3 nodes every step
                assert t["nodes_hist"][3] == t["verify_forwards"] > 0
    # recorded as decoded: the budget gate's dynamic3 has no n-gram candidates
    assert res["methods"]["medusa_tiny+dynamic3"]["dynamic"]["ngram"] == 0
    assert len(res["records"]) == 2 * len(methods)
    rec = next(r for r in res["records"] if r["method"] == "cerberus_tiny+learned")
    assert len(rec["turns"]) == 2 and "cost_ratio" in rec["turns"][0]
    # the second turn's prompt holds the first answer: it is longer than the first prompt
    assert rec["turns"][1]["prompt_tokens"] > rec["turns"][0]["prompt_tokens"]
    assert "yes (2/2)" in (out / "results.md").read_text()
    # Falcon: tau by N mod k, pooled from every turn's counts; none for the other methods
    k = read_config(tiny_exported["falcon"])["model"]["k"]
    phases = rows["falcon_tiny", "all"]["tau_by_phase"]
    assert list(phases) == [str(r) for r in range(k)]
    turns = [t for r in res["records"] if r["method"] == "falcon_tiny" for t in r["turns"]]
    assert sum(p["steps"] for p in phases.values()) == sum(t["verify_forwards"] for t in turns)
    assert sum(p["tokens"] for p in phases.values()) == sum(t["new_tokens"] - 1 for t in turns)
    assert all(rows[m, "all"]["tau_by_phase"] is None for m in methods[:-2])
    assert "τ by N mod k |" in printed and "| 0: " in printed


def test_generate_command(tiny_exported):
    cmd = [sys.executable, "-m", "drafters.cli", "generate",
           "--drafter", str(tiny_exported["cerberus"]),
           "--prompt", "Tell me about topic number 3.", "--max-new-tokens", "12",
           "--threads", "1"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    stats = res.stdout.strip().splitlines()[-1]
    assert "tau " in stats and "alpha " in stats and "tokens/s " in stats
    assert "12 tokens" in stats and "tiny-random-llama-seed0" in stats
    streamed = subprocess.run([*cmd, "--stream"], capture_output=True, text=True, timeout=300,
                              cwd=ROOT)  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr[-2000:]
    text = res.stdout.rsplit("\n[", 1)[0]  # the answer, before the stats line
    assert streamed.stdout.rsplit("\n[", 1)[0].strip() == text.strip()


@pytest.mark.slow
def test_end_to_end_on_the_embedded_target(tmp_path, smollm2):
    """Distil 6 conversations with SmolLM2, train Medusa heads a few steps through the real
    Hydra config, export, and decode: speculative output == HF greedy output."""
    from drafters.data.chat import render_prompt
    from drafters.data.corpus import finalize
    from drafters.data.distillation import DistillConfig, run_distillation
    from drafters.export import export_checkpoint, load_drafter
    from drafters.speculate import speculative_decode
    from drafters.training.run import train

    topics = ["the moon", "bread", "rivers", "chess", "owls", "rain"]
    rows = [
        {"id": f"e2e{i}_0", "conversations": [
            {"from": "human", "value": f"Tell me one fact about {t}."},
            {"from": "gpt", "value": "original answer"}]}
        for i, t in enumerate(topics)
    ]  # fmt: skip
    src = tmp_path / "conversations.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = DistillConfig(max_new_tokens=32, batch_size=6)
    run_distillation(smollm2, str(src), tmp_path / "distilled", cfg, split=None)
    finalize(tmp_path / "distilled", smollm2.identity.to_dict())

    overrides = [o for o in tiny_overrides(tmp_path, tmp_path / "distilled") if o != "target=tiny"]
    overrides += ["target=smollm2_135m", "drafter=medusa", "data.batch_size=2",
                  "trainer.max_steps=4", "trainer.max_epochs=4", "trainer.val_check_interval=1.0",
                  "data.val_fraction=0.3"]  # fmt: skip
    train(compose_config("train", overrides))
    ckpt = next((tmp_path / "logs" / "train").glob("*/checkpoints/last.ckpt"))
    folder = export_checkpoint(ckpt, tmp_path / "medusa_smollm2")

    drafter = load_drafter(folder, smollm2)
    assert drafter.config["target"]["name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert drafter.config["source"]["global_step"] == 4
    for text in ["What is the capital of France?", "Write a short poem about the sea."]:
        ids = torch.tensor([render_prompt(smollm2.tokenizer, [{"role": "user", "content": text}])])
        ref = smollm2.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48
        )
        res = speculative_decode(smollm2, drafter, ids, 48, gate="none")
        assert torch.equal(res.sequences, ref), text
        assert res.tree_steps == res.verify_forwards > 0 and res.tau >= 1.0
        gated = speculative_decode(smollm2, drafter, ids, 48, gate="entropy", cost_ratio=2.0)
        assert torch.equal(gated.sequences, ref), text


def test_bench_resumes_and_shards(tmp_path, capsys):
    """Two shards share the questions; a rerun redoes nothing; a cut record line is run again;
    other settings on the same --out are refused; --merge rebuilds the reports."""
    out = tmp_path / "bench"
    argv = ["--eval-dir", str(write_eval(tmp_path / "eval")), "--target", "tiny",
            "--max-new-tokens", "8", "--threads", "1", "--warmup", "0",
            "--methods", "hf_greedy", "ar", "--out", str(out)]  # fmt: skip
    assert bench_main([*argv, "--shard", "0/2"]) == 0
    assert "2 of 4 questions recorded" in capsys.readouterr().out
    assert not (out / "results.json").exists()
    assert bench_main([*argv, "--shard", "1/2"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert [r["question_id"] for r in res["records"]] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(r["lossless"] for r in res["records"])
    assert res["settings"]["lanes"] == [2]  # two shards: the table says so
    assert "2 lanes side by side" in (out / "results.md").read_text()

    capsys.readouterr()
    assert bench_main(argv) == 0  # everything recorded: nothing runs, the reports are rewritten
    assert "0 questions to run, 4 of 4" in capsys.readouterr().err

    shard_file = sorted((out / "records").glob("*.jsonl"))[-1]
    lines = shard_file.read_text().splitlines()
    shard_file.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # a kill mid-write
    assert bench_main(argv) == 0
    err = capsys.readouterr().err
    assert "1 questions to run" in err
    res = json.loads((out / "results.json").read_text())
    assert sorted(r["question_id"] for r in res["records"]) == [1, 1, 2, 2, 3, 3, 4, 4]

    with pytest.raises(ValueError, match="recorded run's in settings.max_new_tokens"):
        bench_main([*argv[:5], "9", *argv[6:]])
    assert bench_main(["--merge", "--out", str(out)]) == 0
    assert "| ar | all | 4 |" in capsys.readouterr().out


def test_outputs_that_leave_the_baseline_are_reported_where_they_leave_it():
    """bf16 (or any dtype but fp32): agreement with the same-dtype baseline is measured per
    turn and listed, and the column does not say "lossless"."""
    from drafters.eval.records import first_divergence, mark_lossless
    from drafters.eval.report import divergences, markdown, summarize

    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # stopped early: leaves where it ends

    def record(method, *turns):
        return {"question_id": 7, "category": "writing", "method": method, "new_tokens": 6,
                "seconds": 1.0, "tokens_per_s": 6.0,
                "turns": [{"new_tokens": len(t), "_ids": list(t)} for t in turns]}  # fmt: skip

    records = [record("hf_greedy", [1, 2, 3], [4, 5, 6]), record("x", [1, 2, 3], [4, 9, 6])]
    mark_lossless(records)
    assert [t["first_divergence"] for t in records[1]["turns"]] == [None, 1]
    assert records[1]["lossless"] is False and "_ids" not in records[1]["turns"][0]
    listed = divergences(records, "hf_greedy")
    assert "| x | 7 | 2 | 1 | 3 |" in listed and "| x | 7 | 1 |" not in listed
    rows = summarize(records, ["hf_greedy", "x"], "hf_greedy")
    settings = {"bench": "b", "questions": 1, "turns": 2, "max_new_tokens": 3, "threads": 2,
                "target": {"name": "t"}, "dtype": "bfloat16", "device": "cpu"}  # fmt: skip
    table = markdown(rows, settings)
    assert "| same as hf_greedy (bfloat16) | same tokens before a difference, median |" in table
    # x: turn 1 equal (3 tokens), turn 2 leaves at token 1 -> median 2; the baseline: 3
    assert [r["same_prefix"] for r in rows if r["category"] == "all"] == [3, 2]
    assert "| NO (0/1) | 2 |" in table and "| yes (1/1) | 3 |" in table
    fp32 = markdown(rows, {**settings, "dtype": "float32"})
    assert "| lossless |" in fp32 and "same tokens before" not in fp32


@pytest.mark.parametrize(
    "kind, gate",
    [("falcon", "hybrid"), ("medusa", "budget"), ("cerberus", "hybrid+learned"),
     ("medusa", "budget+entropy")],
)  # fmt: skip
def test_generate_with_a_budget_gate_equals_plain_greedy(tiny_exported, kind, gate):
    from drafters.decoding import decode_ar
    from drafters.export import load_drafter
    from drafters.speculate import speculative_decode
    from drafters.testing import tiny_target

    target = tiny_target(seed=0)
    drafter = load_drafter(tiny_exported[kind], target)
    ids = target.tokenizer("Tell me about topic number 3.", return_tensors="pt").input_ids
    res = speculative_decode(target, drafter, ids, 24, gate=gate)
    assert torch.equal(res.sequences, decode_ar(target, ids, 24).sequences)
    cmd = [sys.executable, "-m", "drafters.cli", "generate", "--drafter", str(tiny_exported[kind]),
           "--prompt", "Hi", "--max-new-tokens", "8", "--threads", "1", "--gate", gate]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and f"gate {gate}" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("kind, gate", [("falcon", "budget"), ("medusa", "hybrid")])
def test_a_fixed_size_dynamic_tree_equals_plain_greedy(tiny_exported, kind, gate):
    """`--nodes N`: the dynamic tree verifies N candidates every step."""
    from drafters.decoding import decode_ar
    from drafters.decoding.dynamic import DynamicConfig
    from drafters.export import load_drafter
    from drafters.speculate import speculative_decode
    from drafters.testing import tiny_target

    target = tiny_target(seed=0)
    drafter = load_drafter(tiny_exported[kind], target)
    ids = target.tokenizer("Tell me about topic number 5.", return_tensors="pt").input_ids
    res = speculative_decode(target, drafter, ids, 24, gate=gate, dynamic=DynamicConfig.fixed(4))
    assert torch.equal(res.sequences, decode_ar(target, ids, 24).sequences)
    assert set(res.step_nodes) == {4}
    cmd = [sys.executable, "-m", "drafters.cli", "generate", "--drafter", str(tiny_exported[kind]),
           "--prompt", "Hi", "--max-new-tokens", "8", "--threads", "1", "--gate", gate,
           "--nodes", "4"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and f"gate {gate}" in out.stdout, out.stderr[-2000:]
    wrong = subprocess.run(cmd[:-4] + ["--gate", "none", "--nodes", "4"], capture_output=True,
                           text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert wrong.returncode != 0 and "--nodes sizes a dynamic tree" in wrong.stderr


def test_a_budget_gate_input_the_drafter_lacks_is_refused(tiny_exported):
    from drafters.export import load_drafter
    from drafters.speculate import speculative_decode
    from drafters.testing import tiny_target

    target = tiny_target(seed=0)
    ids = target.tokenizer("Hi", return_tensors="pt").input_ids
    medusa = load_drafter(tiny_exported["medusa"], target)  # trained without a learned gate
    with pytest.raises(ValueError, match="no learned gate"):
        speculative_decode(target, medusa, ids, 4, gate="budget+learned")
    falcon = load_drafter(tiny_exported["falcon"], target)
    with pytest.raises(ValueError, match="has no gate"):
        speculative_decode(target, falcon, ids, 4, gate="hybrid+entropy")


def test_bench_in_bf16_reports_agreement_not_lossless(tmp_path, tiny_exported):
    """--dtype bfloat16: target and drafters run in bf16, every turn records whether it equals
    HF greedy in bf16 and where it first differs, and the table says "same as", never
    "lossless" (issue 18: agreement measured, not assumed)."""
    out = tmp_path / "bench_bf16"
    argv = ["--eval-dir", str(write_eval(tmp_path / "eval")), "--per-category", "1",
            "--max-new-tokens", "12", "--threads", "1", "--dtype", "bfloat16",
            "--methods", "hf_greedy", "ar", "--out", str(out),
            "--drafter", str(tiny_exported["medusa"]) + "@none",
            "--drafter", str(tiny_exported["falcon"])]  # fmt: skip
    assert bench_main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["dtype"] == "bfloat16"
    turns = [t for r in res["records"] for t in r["turns"]]
    assert turns and all(isinstance(t["lossless"], bool) for t in turns)
    assert all((t["first_divergence"] is None) == t["lossless"] for t in turns)
    table = (out / "results.md").read_text()
    assert "same as hf_greedy (bfloat16)" in table and "| lossless |" not in table


def test_drafter_specs_name_fixed_size_dynamic_trees():
    from drafters.eval.methods import fixed_size_gate, split_drafter_spec
    from drafters.speculate import dynamic_config

    assert split_drafter_spec("d/x@none,dynamic3,hybrid12") == (
        "d/x",
        ["none", "dynamic3", "hybrid12"],
    )
    gate, cfg = fixed_size_gate("hybrid12")
    assert gate == "hybrid" and cfg.budget == 12 and cfg.max_nodes == 16 and cfg.ngram > 0
    gate, cfg = fixed_size_gate("dynamic3")
    assert gate == "budget" and cfg.budget == 3
    # decoded (and recorded) as the budget gate decodes: no n-gram candidates unless hybrid
    assert dynamic_config(gate, cfg).ngram == 0 and dynamic_config(gate, cfg).budget == 3
    assert dynamic_config("hybrid+learned", cfg).ngram == cfg.ngram > 0
    assert dynamic_config("budget+entropy", None).ngram == 0
    assert fixed_size_gate("dynamic20")[1].max_nodes == 20 and fixed_size_gate("budget") is None
    with pytest.raises(ValueError, match="unknown gate 'dynamic'.*dynamic<n>"):
        split_drafter_spec("d/x@dynamic")


def test_bench_tree_override_decodes_every_drafter_with_that_tree(tmp_path, tiny_exported):
    """--tree chain2: drafters decode a chain of 2 draft tokens a step (as vLLM's
    num_speculative_tokens=2), losslessly, and the run records it; a dynamic tree's gate keeps
    building its own."""
    out = tmp_path / "bench_chain"
    argv = ["--eval-dir", str(write_eval(tmp_path / "eval")), "--per-category", "1",
            "--max-new-tokens", "12", "--threads", "1", "--turns", "1", "--tree", "chain2",
            "--methods", "hf_greedy", "--out", str(out),
            "--drafter", str(tiny_exported["medusa"]) + "@none,dynamic4",
            "--drafter", str(tiny_exported["falcon"])]  # fmt: skip
    assert bench_main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    trees = {n: m["tree"] for n, m in res["methods"].items() if "tree" in m}
    chained = [n for n, t in trees.items() if t == "chain2"]
    assert len(chained) == 2 and all("dynamic" not in n for n in chained)
    assert any(t != "chain2" for n, t in trees.items() if "dynamic4" in n)
    for r in res["records"]:
        nodes = r["turns"][0].get("nodes_hist", [])
        if r["method"] in chained:
            assert len(nodes) <= 3 and r["lossless"]  # at most 2 draft nodes a step
