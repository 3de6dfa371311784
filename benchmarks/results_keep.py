"""The committed copy of the reference results' state: what `benchmarks/results.sh` has finished
(trained runs, tuning, benchmark records), kept in `data/reference/results/` so that a machine
replaced between sessions (outputs/ and logs/ are git-ignored) loses none of it. The pipeline
takes longer than a session (README: Reference results), so each session keeps what it finished
and commits it; the next restores it and goes on where it stopped.

    python benchmarks/results_keep.py keep    # after a stage: copy what is finished into --keep
    python benchmarks/results_keep.py restore # before the stages: bring the kept state back

What is kept, per part:
  train/<name>/   a finished run (its drafter exported): best.ckpt slimmed to what an export reads
                  (hyper-parameters, the drafter's weights in bf16, the gates' calibration as
                  trained; no optimizer state: ~2 bytes a parameter), its .hydra/ config, csv
                  metrics, fit_end.json, and run.json (wall minutes, machine). Restored as
                  logs/train/kept_<name>/, which results.sh's train stage reuses for results_<name>
                  only if its saved training config equals the one it would train (the same
                  check that reuses any finished run), and otherwise trains anew.
  tune/           every drafters-tune result (*.json); not the kernel plans (kernels.json), which
                  are timed on the machine that runs the bench.
  bench/<table>/  run.json and records/*.jsonl (one line per finished question); the bench resumes
                  from them. Each record names the machine that made it (a restart on another
                  machine is allowed; the report lists the machines).

The kept drafters are bf16: the tables' drafters are these weights read back (in the table's
dtype), the same weights the zoo ships. An interrupted run (no exported drafter) is not kept: its
Lightning checkpoint, with the optimizer state, is too large to commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_report import RUNS, _run_minutes  # noqa: E402

from drafters.io_utils import atomic_file, write_json_atomic  # noqa: E402
from drafters.machine import describe  # noqa: E402

KEPT_PREFIX = "kept_"
RUN_FILES = ("fit_end.json", "csv/metrics.csv")


def slim_checkpoint(ckpt_path: Path) -> dict:
    """What `drafters.export.read_checkpoint` needs of a training checkpoint: hyper-parameters and
    weights (the drafter's floating-point ones in bf16), its step and epoch."""
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    state = {
        k: v.to(torch.bfloat16) if k.startswith("drafter.") and v.is_floating_point() else v
        for k, v in ckpt["state_dict"].items()
    }
    return {
        "hyper_parameters": ckpt["hyper_parameters"],
        "state_dict": state,
        "global_step": ckpt.get("global_step"),
        "epoch": ckpt.get("epoch"),
    }


def _chosen_checkpoint(run_dir: Path) -> Path:
    ckpts = run_dir / "checkpoints"
    return ckpts / "best.ckpt" if (ckpts / "best.ckpt").is_file() else ckpts / "last.ckpt"


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(dst) as tmp:
        shutil.copyfile(src, tmp)


def keep_run(name: str, run_dir: Path, dest: Path) -> bool:
    """Copy a finished run into `dest`; False when it is not finished or is kept already (the
    kept copy is as new as the run's fit_end.json)."""
    if (
        not (run_dir / "drafter" / "config.json").is_file()
        or not (run_dir / "fit_end.json").is_file()
    ):
        return False
    if run_dir.resolve().name.startswith(KEPT_PREFIX):  # restored from the kept copy itself
        return False
    if not (run_dir / ".hydra" / "config.yaml").is_file():  # what a restored copy is matched by
        print(f"[keep] {run_dir}: no .hydra/config.yaml (not trained by train.py?): not kept")
        return False
    if (dest / "run.json").is_file() and (dest / "run.json").stat().st_mtime >= (
        run_dir / "fit_end.json"
    ).stat().st_mtime:
        return False
    ckpt = _chosen_checkpoint(run_dir)
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_file(dest / "best.ckpt") as tmp:
        torch.save(slim_checkpoint(ckpt), tmp)
    for rel in RUN_FILES:
        _copy(run_dir / rel, dest / rel)
    for name_ in ("config.yaml", "overrides.yaml"):  # hydra.yaml: this machine's paths, unused
        if (run_dir / ".hydra" / name_).is_file():
            _copy(run_dir / ".hydra" / name_, dest / ".hydra" / name_)
    minutes = _run_minutes(run_dir)
    write_json_atomic(dest / "run.json", {
        "name": name,
        "checkpoint": ckpt.name,
        "drafter_dtype": "bfloat16",
        "minutes": minutes,
        "machine": _run_machine(run_dir) or describe(),
    })  # fmt: skip
    return True


def _run_machine(run_dir: Path) -> str | None:
    path = run_dir / "run.json"
    return json.loads(path.read_text()).get("machine") if path.is_file() else None


def restore_run(src: Path, run_dir: Path) -> bool:
    """Rebuild a run folder from its kept copy: the slim checkpoint as best.ckpt, the drafter
    exported from it (fp32, as the training's publish callback does), config, metrics and
    fit_end.json. False when the folder exists."""
    from drafters.export import export_checkpoint

    if run_dir.exists():
        return False
    tmp = run_dir.with_name(f".{run_dir.name}.restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "checkpoints").mkdir(parents=True)
    shutil.copyfile(src / "best.ckpt", tmp / "checkpoints" / "best.ckpt")
    for rel in (*RUN_FILES, "run.json"):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, tmp / rel)
    shutil.copytree(src / ".hydra", tmp / ".hydra")
    export_checkpoint(tmp / "checkpoints" / "best.ckpt", tmp / "drafter", "float32", None, False)
    os.replace(tmp, run_dir)
    return True


def _sync_files(pairs: list[tuple[Path, Path]]) -> int:
    """Copy each (src, dst) where dst is missing or differs (a records file grows by lines)."""
    n = 0
    for src, dst in pairs:
        if dst.is_file() and dst.read_bytes() == src.read_bytes():
            continue
        _copy(src, dst)
        n += 1
    return n


def _state_files(root: Path) -> list[Path]:
    """The tune and bench files under `root` (an --out or a --keep folder), relative to it."""
    files = [p for p in root.glob("tune/*.json")]
    files += [p for p in root.glob("bench/*/run.json")]
    files += [p for p in root.glob("bench/*/records/*.jsonl")]
    return [p.relative_to(root) for p in sorted(files)]


def keep(out: Path, logs: Path, kept: Path) -> None:
    runs = [n for n in RUNS if keep_run(n, logs / f"results_{n}", kept / "train" / n)]
    files = _sync_files([(out / p, kept / p) for p in _state_files(out)])
    print(f"[keep] {kept}: kept runs {runs or 'none new'}; {files} tune/bench files updated; "
          "commit the folder to keep them past this machine")  # fmt: skip


def restore(out: Path, logs: Path, kept: Path) -> None:
    runs = [
        n for n in RUNS
        if (kept / "train" / n / "run.json").is_file()
        and restore_run(kept / "train" / n, logs / f"{KEPT_PREFIX}{n}")
    ]  # fmt: skip
    files = [p for p in _state_files(kept) if not (out / p).is_file()]
    _sync_files([(kept / p, out / p) for p in files])
    # a tune result counts as done when newer than the run's checkpoint (results.sh): restored
    # results are made newer than every restored checkpoint, those restored by an earlier call too
    # (else a tune file restored after its run was would look stale, and be tuned again)
    ckpts = [logs / f"{KEPT_PREFIX}{n}" / "checkpoints" / "best.ckpt" for n in RUNS]
    now = max([c.stat().st_mtime for c in ckpts if c.is_file()] or [0.0]) + 1
    for p in files:
        if p.parts[0] == "tune":
            os.utime(out / p, (now, now))
    print(f"[restore] from {kept}: runs {runs or 'none'}; {len(files)} tune/bench files")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/results_keep.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("command", choices=["keep", "restore"])
    p.add_argument("--out", default="outputs/results", help="results.sh's OUT")
    p.add_argument("--logs", default="logs/train", help="where the training runs are")
    p.add_argument("--keep", default="data/reference/results", help="the committed copy")
    args = p.parse_args(argv)
    out, logs, kept = Path(args.out), Path(args.logs), Path(args.keep)
    (keep if args.command == "keep" else restore)(out, logs, kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
