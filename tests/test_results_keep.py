"""benchmarks/results_keep.py: the committed copy of the reference results' finished state, kept
from one machine and restored on another, loses no run, tune result or benchmark record."""

import json
import shutil

import torch
from train_helpers import load_script

from drafters.export import load_drafter, read_checkpoint

keep_mod = load_script("benchmarks/results_keep.py")


def _finished_run(tiny_checkpoints, logs):
    """A finished run of the reference set (its drafter exported, fit_end.json written), as
    results.sh leaves it: the tiny Cerberus run, with its learned and entropy gates."""
    src = tiny_checkpoints["cerberus"].parents[1]
    assert (src / "drafter" / "config.json").is_file() and (src / "fit_end.json").is_file()
    run = logs / "results_cerberus"
    shutil.copytree(src, run)
    (run / ".hydra").mkdir(exist_ok=True)  # train.py's Hydra writes it (the test composed)
    (run / ".hydra" / "config.yaml").write_text("drafter:\n  kind: cerberus\n")
    return run


def test_keep_then_restore_on_a_new_machine(tmp_path, tiny, tiny_checkpoints):
    logs, out, kept = tmp_path / "logs", tmp_path / "out", tmp_path / "kept"
    run = _finished_run(tiny_checkpoints, logs)
    (out / "tune").mkdir(parents=True)
    (out / "tune" / "cerberus.json").write_text('{"tree": "chosen"}')
    (out / "kernels.json").write_text("{}")  # this machine's kernel plans: not kept
    records = out / "bench" / "mt_bench" / "records"
    records.mkdir(parents=True)
    (out / "bench" / "mt_bench" / "run.json").write_text('{"settings": {}, "methods": {}}')
    (records / "host-1.jsonl").write_text('{"question_id": 81, "records": []}\n')
    # a run still training (no exported drafter) is not kept
    (logs / "results_falcon_k2" / "checkpoints").mkdir(parents=True)

    keep_mod.main(["keep", "--out", str(out), "--logs", str(logs), "--keep", str(kept)])
    assert sorted(p.name for p in (kept / "train").iterdir()) == ["cerberus"]
    slim = kept / "train" / "cerberus" / "best.ckpt"
    chosen = keep_mod._chosen_checkpoint(run)
    assert slim.stat().st_size < chosen.stat().st_size  # no optimizer state
    assert (kept / "tune" / "cerberus.json").is_file() and not (kept / "kernels.json").exists()
    assert (kept / "bench" / "mt_bench" / "records" / "host-1.jsonl").is_file()

    # the bench went on: a grown records file is kept again, the unchanged run is not
    with open(records / "host-1.jsonl", "a") as f:
        f.write('{"question_id": 82, "records": []}\n')
    before = (kept / "train" / "cerberus" / "run.json").stat().st_mtime_ns
    keep_mod.main(["keep", "--out", str(out), "--logs", str(logs), "--keep", str(kept)])
    assert (kept / "bench" / "mt_bench" / "records" / "host-1.jsonl").read_text().count("\n") == 2
    assert (kept / "train" / "cerberus" / "run.json").stat().st_mtime_ns == before

    # a new machine: empty logs and outputs
    logs2, out2 = tmp_path / "logs2", tmp_path / "out2"
    keep_mod.main(["restore", "--out", str(out2), "--logs", str(logs2), "--keep", str(kept)])
    back = logs2 / "kept_cerberus"
    assert (back / ".hydra" / "config.yaml").read_text() == (
        run / ".hydra" / "config.yaml"
    ).read_text()
    assert (back / "csv" / "metrics.csv").read_text() == (run / "csv" / "metrics.csv").read_text()
    assert json.loads((back / "fit_end.json").read_text()) == json.loads(
        (run / "fit_end.json").read_text()
    )
    # the same drafter, in bf16, with its gates as trained
    orig, restored = read_checkpoint(chosen), read_checkpoint(back / "checkpoints" / "best.ckpt")
    assert restored["hparams"] == orig["hparams"]
    for k, v in orig["drafter"].items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert torch.equal(restored["drafter"][k], want), k
    for group in ("gate", "entropy_gate"):
        for k, v in orig[group].items():
            assert torch.equal(restored[group][k], v), (group, k)
    loaded = load_drafter(back / "drafter", tiny)  # exported, loads beside its target
    assert loaded.kind == "cerberus" and set(loaded.gates) == {"entropy", "learned"}
    # tune results count as done (newer than the restored checkpoint), records are back
    assert (out2 / "tune" / "cerberus.json").stat().st_mtime > (
        back / "checkpoints" / "best.ckpt"
    ).stat().st_mtime
    assert (out2 / "bench" / "mt_bench" / "records" / "host-1.jsonl").read_text().count("\n") == 2
    # linked as results_cerberus by results.sh (the same training config), it is not kept again
    (logs2 / "results_cerberus").symlink_to("kept_cerberus")
    keep_mod.main(["keep", "--out", str(out2), "--logs", str(logs2), "--keep", str(kept)])
    assert (kept / "train" / "cerberus" / "run.json").stat().st_mtime_ns == before
    (logs2 / "results_cerberus").unlink()
    # restoring again changes nothing that is there
    keep_mod.main(["restore", "--out", str(out2), "--logs", str(logs2), "--keep", str(kept)])
    assert sorted(p.name for p in logs2.iterdir()) == ["kept_cerberus"]
    # a tune result gone from the outputs while its run stays restored (an earlier restore) comes
    # back newer than that run's checkpoint, so results.sh counts it done instead of tuning again
    (out2 / "tune" / "cerberus.json").unlink()
    keep_mod.main(["restore", "--out", str(out2), "--logs", str(logs2), "--keep", str(kept)])
    assert (out2 / "tune" / "cerberus.json").stat().st_mtime > (
        back / "checkpoints" / "best.ckpt"
    ).stat().st_mtime
