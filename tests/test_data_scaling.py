"""benchmarks/data_scaling.py end to end on the tiny target: nested budgets, one rule for all,
held-out decoding checked against AR, and a re-run that trains and decodes nothing again."""

import json
import subprocess
import sys

from train_helpers import ROOT, tiny_overrides


def test_scaling_runs_resume_and_report(tmp_path, tiny_distilled):
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled) if not o.startswith("paths.")]
    cmd = [
        sys.executable, "benchmarks/data_scaling.py", "--drafters", "medusa",
        "--tokens", "60", "all", "--prompts", "2", "--max-new-tokens", "12", "--depth", "3",
        "--target", "tiny", "--log-dir", str(tmp_path / "logs"), "--out", str(tmp_path / "out"),
        *over, "drafter.model.draft_vocab_size=64", "trainer.val_check_interval=1.0",
        "trainer.max_epochs=3",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    small = json.loads((tmp_path / "out" / "scaling_medusa_60.json").read_text())
    full = json.loads((tmp_path / "out" / "scaling_medusa_all.json").read_text())
    assert small["train_answer_tokens"] <= 60 < full["train_answer_tokens"]
    assert small["lossless"] and small["prompts"] == 2 and len(small["accept_at_depth"]) == 3
    assert 1.0 <= small["tau"] and all(0 <= x <= 1 for x in small["accept_at_depth"])
    assert "| scaling_medusa_60 |" in res.stdout and "| scaling_medusa_all |" in res.stdout
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "[scaling] " not in again.stdout  # nothing redone
