"""A DeepSpeed checkpoint folder exports like the file it replaces. The folder is written by
DeepSpeed's own engine (ZeRO-2, CPU accelerator, one process) the way Lightning's
DeepSpeedStrategy.save_checkpoint writes it: the module wrapped as `_forward_module`, the
Lightning checkpoint minus its state_dict as client state, tag "checkpoint". Lightning's strategy
itself runs on CUDA only; benchmarks/gpu_check.sh trains, resumes and exports through it."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("deepspeed")

WRITE = r"""
import os, sys, torch
os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
import deepspeed
from drafters.training.module import DrafterLitModule

src, out, port = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["MASTER_PORT"] = port
ckpt = torch.load(src, weights_only=True)
module = DrafterLitModule(**ckpt["hyper_parameters"])
module.load_state_dict(ckpt["state_dict"])

class Wrapper(torch.nn.Module):  # Lightning's _LightningModuleWrapperBase names it so
    def __init__(self, m):
        super().__init__()
        self._forward_module = m

model = Wrapper(module)
deepspeed.init_distributed(dist_backend="gloo")
config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
client = {k: v for k, v in ckpt.items() if k not in ("state_dict", "optimizer_states")}
engine.save_checkpoint(out, client_state=client, tag="checkpoint")
"""


def test_a_zero2_checkpoint_folder_exports_the_same_drafter(tmp_path, tiny_checkpoints):
    from drafters.export import export_checkpoint, load_drafter

    src = tiny_checkpoints["cerberus"]
    folder = tmp_path / "last.ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", WRITE, str(src), str(folder), str(29500 + os.getpid() % 400)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (folder / "latest").is_file() and (folder / "checkpoint").is_dir()

    from_folder = export_checkpoint(folder, tmp_path / "from_folder")
    from_file = export_checkpoint(src, tmp_path / "from_file")
    a = load_file(from_folder / "model.safetensors")
    b = load_file(from_file / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ca = json.loads((from_folder / "config.json").read_text())
    cb = json.loads((from_file / "config.json").read_text())
    assert ca["gate"] == cb["gate"] and ca["model"] == cb["model"]
    assert ca["source"]["global_step"] == cb["source"]["global_step"]
    load_drafter(from_folder)


def test_a_folder_that_is_not_a_deepspeed_checkpoint_is_refused(tmp_path):
    from drafters.export import ExportError, export_checkpoint

    (tmp_path / "x.ckpt").mkdir()
    with pytest.raises(ExportError, match="not a DeepSpeed checkpoint"):
        export_checkpoint(tmp_path / "x.ckpt", tmp_path / "out")
