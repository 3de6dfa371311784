"""benchmarks/gpu_check.sh, the parts a CPU can check: its arguments, its wheel list, and that the
commands it runs on a GPU compose under Hydra and parse (the GPU run itself: see the script)."""

import shlex
import subprocess

import pytest
from train_helpers import ROOT, compose_config

from drafters.cli import bench_args

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_help_and_bad_arguments():
    assert run("--help").returncode == 0 and "--prepare" in run("--help").stdout
    for bad in (["--steps", "x"], ["--steps", "1"], ["--target", "gpt2"], ["--nope"]):
        res = run(*bad)
        assert res.returncode == 2 and res.stderr.startswith("gpu_check: "), bad


def test_the_wheel_list_covers_what_a_bare_cuda_image_lacks():
    wheels = run("--list-wheels").stdout.split()
    assert {"hydra-core", "omegaconf", "datasets", "deepspeed", "gguf"} <= set(wheels)
    assert not {"torch", "lightning", "transformers", "wandb"} & set(wheels)  # present / unused


@pytest.mark.parametrize("target", ["tiny", "smollm2_135m"])
def test_the_dry_run_commands_compose(target, tmp_path):
    res = run("--dry-run", "--target", target, "--out", str(tmp_path / "out"), "--steps", "10")
    assert res.returncode == 0, res.stderr
    cmds = [shlex.split(line[2:]) for line in res.stderr.splitlines() if line.startswith("+ ")]
    trains = [c[2:] for c in cmds if c[1] == "train.py"]
    assert len(trains) == 2 and trains[1][-1] == "ckpt_path=last"
    for argv, steps in zip(trains, (5, 10), strict=True):
        cfg = compose_config("train", argv)
        assert cfg.strategy._target_.endswith("DeepSpeedStrategy") and cfg.strategy.stage == 2
        assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"
        assert cfg.trainer.max_steps == steps and cfg.run_name == "gpu_check"
        assert cfg.target._target_.endswith("tiny_target" if target == "tiny" else "gguf")
    distill = next(c for c in cmds if c[1] == "data/distill.py")
    cfg = compose_config("distill", distill[2:])
    assert cfg.max_conversations == 64 and (target == "tiny" or cfg.target.device == "cuda")
    (bench,) = [c for c in cmds if c[1:4] == ["-m", "drafters.cli", "bench"]]
    args = bench_args(bench[4:])
    assert args.dtype == "float32" and args.device == "cuda" and args.methods == ["hf_greedy"]
