"""Training as users launch it: `python train.py ...` in a subprocess (DDP, W&B offline)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from train_helpers import ROOT, compose_config, tiny_overrides


def run_train(args, tmp_path, env_extra=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env.update({"WANDB_SILENT": "true", "OMP_NUM_THREADS": "1", **(env_extra or {})})
    res = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return res


def test_two_process_ddp_on_cpu(tmp_path, tiny_distilled):
    over = tiny_overrides(
        tmp_path,
        tiny_distilled,
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.max_steps=2",
        "callbacks.checkpoint.every_n_train_steps=2",
    )
    res = run_train(over, tmp_path)
    assert "distributed_backend=gloo" in res.stderr + res.stdout
    ckpt = torch.load(tmp_path / "logs/train/falcon_tiny/checkpoints/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2


def test_wandb_offline_run_leaves_files_and_keeps_its_id(tmp_path, tiny_distilled):
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled) if o != "logger=csv"]
    over += [
        "logger=wandb",
        "trainer.max_steps=2",
        "trainer.max_epochs=3",
        "callbacks.checkpoint.every_n_train_steps=2",
    ]
    run_train(over, tmp_path)
    run_dir = tmp_path / "logs/train/falcon_tiny"
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(run_id)
    assert list(runs[0].glob("run-*.wandb"))
    assert (run_dir / "csv" / "metrics.csv").is_file()  # the CSV copy
    run_train(
        over[:-3]
        + [
            "trainer.max_steps=4",
            "trainer.max_epochs=3",
            "ckpt_path=last",
            "callbacks.checkpoint.every_n_train_steps=2",
        ],
        tmp_path,
    )
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # same W&B run


def test_missing_data_says_the_command(tmp_path):
    env = {"DRAFTERS_ROOT": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "target=tiny", "logger=csv"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "python data/distill.py target=tiny" in res.stderr


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3", "deepspeed_zero3_offload"])
def test_deepspeed_strategies_are_built_from_config(name, tmp_path, tiny_distilled):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    cfg = compose_config("train", tiny_overrides(tmp_path, tiny_distilled, f"strategy={name}"))
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, DeepSpeedStrategy)
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == cfg.strategy.stage
    offload = "offload_optimizer" in zero and zero["offload_optimizer"].get("device") == "cpu"
    assert offload == name.endswith("offload")


def test_offline_features_train_from_the_cached_command(tmp_path, tiny_distilled):
    over = tiny_overrides(tmp_path, tiny_distilled, "features_dtype=float32")
    res = subprocess.run(
        [sys.executable, str(ROOT / "data" / "cache_features.py"), *over],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "bytes/token" in res.stdout
    assert Path(tmp_path / "features" / "train" / "meta.json").is_file()
    run_train(over + ["data.features=offline"], tmp_path)
