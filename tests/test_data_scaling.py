"""benchmarks/data_scaling.py end to end on the tiny target: nested budgets, one rule for all,
held-out decoding checked against AR, and a re-run that trains and decodes nothing again."""

import json
import subprocess
import sys

from train_helpers import ROOT, load_script, tiny_overrides


def test_scaling_runs_resume_and_report(tmp_path, tiny_distilled):
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled) if not o.startswith("paths.")]
    cmd = [
        sys.executable, "benchmarks/data_scaling.py", "--drafters", "medusa",
        "--tokens", "60", "all", "--prompts", "2", "--max-new-tokens", "12", "--depth", "3",
        "--target", "tiny", "--log-dir", str(tmp_path / "logs"), "--out", str(tmp_path / "out"),
        *over, "drafter.model.draft_vocab_size=64", "trainer.val_check_interval=1.0",
        "trainer.check_val_every_n_epoch=1",
        "trainer.max_epochs=3",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    small = json.loads((tmp_path / "out" / "scaling_medusa_60.json").read_text())
    full = json.loads((tmp_path / "out" / "scaling_medusa_all.json").read_text())
    assert small["train_answer_tokens"] <= 60 < full["train_answer_tokens"]
    assert small["lossless"] and small["prompts"] == 2 and len(small["accept_at_depth"]) == 3
    assert "train_tokens_per_s" in small and small["precision"] in ("32-true", "bf16-mixed")
    assert 1.0 <= small["tau"] and all(0 <= x <= 1 for x in small["accept_at_depth"])
    assert "| scaling_medusa_60 |" in res.stdout and "| scaling_medusa_all |" in res.stdout
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "[scaling] " not in again.stdout  # nothing redone


def test_a_run_with_the_same_training_is_reused_and_one_with_other_settings_refused(
    tmp_path, tiny_distilled, capsys
):
    """heldout.train_run: the ablation's decode_k2 and the scaling curve's Falcon at one budget
    are one training; a run folder never resumes or serves other settings."""
    import pytest

    heldout = load_script("benchmarks/heldout.py")
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled) if not o.startswith("paths.")]
    over += ["drafter.model.draft_vocab_size=64", "data.max_train_tokens=60",
             "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=1"]  # fmt: skip
    logs = str(tmp_path / "logs")
    first = heldout.train_run("scaling_falcon_60", "falcon_smollm2", over, logs)
    assert (first / "drafter" / "config.json").is_file()
    # the same settings spelled otherwise (k=2 and the decode variant are the defaults)
    same = ["drafter.model.k=2", "drafter.csgd.variant=decode", *over]
    assert heldout.train_run("ablation_decode_k2_60", "falcon_smollm2", same, logs) == first
    assert "the same training as scaling_falcon_60: reused" in capsys.readouterr().out
    assert not (tmp_path / "logs" / "train" / "ablation_decode_k2_60").exists()
    with pytest.raises(SystemExit, match=r"other settings \(optim\.lr\)"):
        heldout.train_run("scaling_falcon_60", "falcon_smollm2", [*over, "optim.lr=0.5"], logs)


def test_draft_vocabulary_sizes_are_runs_of_their_own(tmp_path, tiny_distilled):
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled) if not o.startswith("paths.")]
    cmd = [
        sys.executable, "benchmarks/data_scaling.py", "--drafters", "medusa", "--tokens", "all",
        "--vocab", "32", "64", "--prompts", "2", "--max-new-tokens", "8", "--depth", "2",
        "--target", "tiny", "--log-dir", str(tmp_path / "logs"), "--out", str(tmp_path / "out"),
        *over, "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=1",
        "trainer.max_epochs=1",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    for size in (32, 64):
        row = json.loads((tmp_path / "out" / f"scaling_medusa_all_v{size}.json").read_text())
        assert row["draft_vocab"]["size"] == size and row["lossless"]
        assert 0 < row["draft_vocab"]["coverage_validation"] <= 1
        cfg = (tmp_path / "logs" / "train" / row["run"] / ".hydra" / "config.yaml").read_text()
        assert f"draft_vocab_size: {size}" in cfg
        assert f"| scaling_medusa_all_v{size} | " in res.stdout
        assert f"| {size} (" in res.stdout


def test_an_override_swallowed_by_tokens_is_refused_before_any_run():
    """`--tokens 100000 data.features=offline` would otherwise train on online features with a
    budget named after the override."""
    script = "benchmarks/data_scaling.py"
    cmd = [sys.executable, script, "--tokens", "100000", "data.features=offline"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2
    assert "'data.features=offline' is not a token budget" in res.stderr
    assert "--tokens 100000 -- data.features=offline" in res.stderr
