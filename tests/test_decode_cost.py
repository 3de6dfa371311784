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
    # numbers in every cell; their values are timings of a tiny model, noise not behaviour
    # (a 6-token decode can even time below a 1-token one), so only benchmarks read them
    assert len([float(r.split("|")[-2]) for r in rows]) == len(kinds)


def test_before_and_after_in_one_interleaved_run():
    """--before REF: each round runs both arms (the code of REF, imported from an archive of it,
    and this tree), and the table has both break-even τ per decoder and tree."""
    cmd = [sys.executable, "benchmarks/decode_cost.py", "--target", "tiny", "--prompts", "1",
           "--max-new-tokens", "4", "--before", "HEAD", "--rounds", "2"]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("round 1/2: before") == 1 and "round 2/2: after" in res.stderr
    rows = [ln.split("|")[1:-1] for ln in res.stdout.splitlines() if ln.startswith("| ")]
    assert "before: break-even τ" in rows[0][3] and rows[0][6].strip() == "after / before"
    body = [[c.strip() for c in r] for r in rows[1:]]
    assert [r[0] for r in body] == ["HF greedy", "AR loop"] + ["medusa"] * 3 + ["cerberus"] * 3 + [
        "falcon"
    ] * 3
    for r in body[1:]:
        for cell in (r[3], r[5]):  # "median (min-max)", timings of a tiny model: any sign
            median, spread = cell.split(" ", 1)
            float(median)
            assert spread.startswith("(") and spread.endswith(")")
        float(r[6])
