"""Shipped drafters keep their τ (zoo/<target>/<kind>/, drafters/eval/zoo.py), and the record,
check and ship machinery works, on the tiny target."""

import json
import shutil

import pytest
from test_generate_bench import write_eval
from train_helpers import ROOT

from drafters.cli import bench_main
from drafters.eval import zoo
from drafters.export import read_config

SHIPPED = zoo.shipped(ROOT / "zoo")


@pytest.mark.parametrize("folder", SHIPPED, ids=[f"{p.parent.name}/{p.name}" for p in SHIPPED])
def test_shipped_drafter_keeps_its_tau(folder):
    """τ on ZOO_PROMPTS (fp32 target, the drafter's tree, no gate) at or above the recorded
    value minus zoo.TAU_MARGIN, and every output equal to plain greedy."""
    now, recorded = zoo.check(folder)
    assert now >= recorded - zoo.TAU_MARGIN


def test_record_then_check(tmp_path, tiny, tiny_exported):
    folder = tmp_path / "tiny" / "medusa"  # zoo/<target>/<kind>
    shutil.copytree(tiny_exported["medusa"], folder)
    entry = zoo.record(folder, tiny, made_by="a 3-step tiny run")
    tau = entry["tau"]["tau"]
    assert tau >= 1.0 and len(entry["tau"]["per_prompt"]) == len(zoo.ZOO_PROMPTS)
    assert entry["made_by"] == "a 3-step tiny run" and entry["tau"]["gate"] == "none"
    assert zoo.check(folder, tiny) == (pytest.approx(tau), pytest.approx(tau))
    assert zoo.shipped(tmp_path) == [folder]

    entry["tau"]["tau"] = tau + 2 * zoo.TAU_MARGIN  # as if a change had cost acceptance
    (folder / zoo.ZOO_FILE).write_text(json.dumps(entry))
    with pytest.raises(zoo.ZooError, match="costs acceptance"):
        zoo.check(folder, tiny)
    (folder / zoo.ZOO_FILE).unlink()
    with pytest.raises(zoo.ZooError, match="zoo.json is missing"):
        zoo.check(folder, tiny)


def test_ship_picks_the_fastest_lossless_method_of_each_kind(tmp_path, tiny, tiny_exported):
    bench = tmp_path / "bench"
    argv = ["--eval-dir", str(write_eval(tmp_path / "eval")), "--per-category", "1",
            "--max-new-tokens", "8", "--threads", "1", "--methods", "hf_greedy",
            "--out", str(bench),
            "--drafter", str(tiny_exported["medusa"]) + "@none,entropy",
            "--drafter", str(tiny_exported["falcon"]) + "@none,hybrid"]  # fmt: skip
    assert bench_main(argv) == 0
    best = zoo.best_per_kind(bench)
    assert set(best) == {"medusa", "falcon"}
    assert best["falcon"]["method"] == "falcon_tiny"  # a hybrid tree is never what ships
    assert best["medusa"]["method"] in ("medusa_tiny", "medusa_tiny+entropy")
    summary = json.loads((bench / "results.json").read_text())["summary"]
    medusa = [r for r in summary if r["category"] == "all" and r["method"].startswith("medusa")]
    fastest = max(medusa, key=lambda r: r["speedup"])
    assert best["medusa"]["method"] == fastest["method"]

    out = tmp_path / "zoo" / "tiny"
    folders = zoo.ship(bench, out, made_by={"falcon_tiny": "3 steps"}, target=tiny)
    assert sorted(p.name for p in folders) == ["falcon", "medusa"]
    for kind in ("falcon", "medusa"):
        cfg = read_config(out / kind)
        src = read_config(tiny_exported[kind])
        assert cfg["weights"]["dtype"] == "bfloat16" and cfg["kind"] == kind
        assert cfg["tree"]["spec"] == src["tree"]["spec"]
        entry = json.loads((out / kind / zoo.ZOO_FILE).read_text())
        assert entry["bench"]["drafter"] == f"{kind}_tiny" and entry["tau"]["tau"] >= 1.0
    assert json.loads((out / "falcon" / zoo.ZOO_FILE).read_text())["made_by"] == "3 steps"
