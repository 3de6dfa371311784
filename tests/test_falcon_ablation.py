"""benchmarks/falcon_ablation.py end to end on the tiny target: two variants trained under one
rule, held-out decode-faithful rates and τ by N mod k, a re-run that redoes nothing."""

import json
import subprocess
import sys

from train_helpers import ROOT, tiny_overrides


def test_ablation_runs_report_and_resume(tmp_path, tiny_distilled, heldout_cache):
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled) if not o.startswith("paths.")]
    cmd = [
        sys.executable, "benchmarks/falcon_ablation.py", "--runs", "paper_k2", "decode_k3",
        "--tokens", "all", "--prompts", "2", "--max-new-tokens", "12", "--target", "tiny",
        "--dataset-dir", str(tiny_distilled), "--cache-dir", str(heldout_cache),
        "--max-length", "64", "--log-dir", str(tmp_path / "logs"), "--out", str(tmp_path / "out"),
        *over, "drafter.model.draft_vocab_size=64", "trainer.val_check_interval=1.0",
        "trainer.check_val_every_n_epoch=1",
        "trainer.max_epochs=2",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    for name, k in (("paper_k2", 2), ("decode_k3", 3)):
        row = json.loads((tmp_path / "out" / f"ablation_{name}_all.json").read_text())
        assert row["lossless"] and row["k"] == k and len(row["depth_rates"]) == 2 * k
        assert all(0 <= x <= 1 for x in row["depth_rates"]) and row["tau"] >= 1.0
        assert set(row["tau_by_phase"]) == {str(r) for r in range(k)}
        assert f"| {name} | {k} |" in res.stdout
    cfg = (tmp_path / "logs/train/ablation_paper_k2_all/.hydra/config.yaml").read_text()
    assert "variant: paper" in cfg
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "[ablation] " not in again.stdout  # nothing redone
