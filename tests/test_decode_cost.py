"""benchmarks/decode_cost.py on the tiny target: every decoder and tree gets a row, outputs are
checked against the AR loop, break-even τ is step / HF greedy step."""

import subprocess
import sys

from train_helpers import ROOT


def test_decode_cost_prints_every_row():
    cmd = [sys.executable, "benchmarks/decode_cost.py", "--target", "tiny", "--prompts", "1",
           "--max-new-tokens", "6"]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| ") and "ms a step" not in ln]
    assert rows[0].startswith("| HF greedy | - |") and rows[0].endswith("| 1.00 |")
    kinds = [r.split("|")[1].strip() for r in rows]
    assert kinds == ["HF greedy", "AR loop"] + ["medusa"] * 3 + ["cerberus"] * 3 + ["falcon"] * 3
    assert all(float(r.split("|")[-2]) > 0 for r in rows)
