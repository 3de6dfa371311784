"""slurm/ scripts under a fake SLURM (srun, scontrol) on CPU: world, resume, preemption."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_helpers import ROOT, tiny_overrides

SCRIPTS = sorted((ROOT / "slurm").glob("*.sbatch")) + sorted((ROOT / "slurm").glob("*.sh"))
FAKE = Path(__file__).parent / "fake_slurm"


def slurm_env(tmp_path, ntasks, job_id="4242"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "WANDB"))}
    env.update(
        PATH=f"{FAKE}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NAME="drafters-train",
        SLURM_NTASKS=str(ntasks),
        SLURM_NTASKS_PER_NODE=str(ntasks),
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODELIST="localhost",
        SLURM_SUBMIT_DIR=str(ROOT),
        SLURM_CPUS_PER_TASK="1",
        FAKE_SCONTROL_LOG=str(tmp_path / "scontrol.log"),
    )
    return env


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def sbatch_train(tmp_path, over):
    """slurm/train.sbatch as sbatch would start it: 1 node, 2 tasks, the fake srun."""
    res = subprocess.run(
        ["bash", str(ROOT / "slurm" / "train.sbatch"), *over],
        env=slurm_env(tmp_path, 2),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def test_train_sbatch_builds_the_slurm_world(tmp_path, tiny_distilled):
    over = tiny_overrides(
        tmp_path,
        tiny_distilled,
        "strategy=ddp",
        "trainer.max_steps=2",
        "callbacks.checkpoint.every_n_train_steps=2",
    )
    out = sbatch_train(tmp_path, over)
    run_dir = tmp_path / "logs" / "train" / "falcon_tiny"
    for rank in (0, 1):
        assert (
            f"[train] rank {rank}/2 (node 0, local {rank}), cluster SLURMEnvironment, "
            f"run_dir {run_dir}, resume no"
        ) in out
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    # the same job again (a requeue): both ranks resume from the run's own last checkpoint
    over2 = [o for o in over if not o.startswith("trainer.max_steps")] + [
        "trainer.max_steps=4",
        "trainer.max_epochs=3",
    ]
    out = sbatch_train(tmp_path, over2)
    assert f"resume {run_dir / 'checkpoints' / 'last.ckpt'}" in out
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_preemption_signal_checkpoints_requeues_and_resumes(tmp_path, tiny_distilled):
    over = tiny_overrides(
        tmp_path,
        tiny_distilled,
        "trainer.max_steps=100000",
        "trainer.max_epochs=1000",
        "callbacks.checkpoint.every_n_train_steps=2",
        "ckpt_path=last",
        # training must outlive the signal: an early stop ends the fit, and a fit that ends
        # deletes its pre-emption checkpoints (RunCheckpoint.on_train_end) before the kill
        "~callbacks.early_stopping",
    )
    env = slurm_env(tmp_path, 1, job_id="777")
    env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"] = "0", "0", "0"
    run_dir = tmp_path / "logs" / "train" / "falcon_tiny"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *over],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (run_dir / "checkpoints" / "last.ckpt").exists():
            assert proc.poll() is None and time.time() < deadline, "training did not start"
            time.sleep(0.5)
        proc.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=SIGUSR1@90` delivers
        while not list(run_dir.glob("hpc_ckpt_*.ckpt")) or not (tmp_path / "scontrol.log").exists():
            assert proc.poll() is None and time.time() < deadline, "no pre-emption checkpoint"
            time.sleep(0.5)
        time.sleep(1)
    finally:
        proc.kill()  # SLURM ends the job after requeueing it
        proc.wait()
    assert (tmp_path / "scontrol.log").read_text().strip() == "requeue 777"
    hpc = sorted(run_dir.glob("hpc_ckpt_*.ckpt"))[-1]
    step = torch.load(hpc, weights_only=True)["global_step"]
    os.utime(hpc)  # newest: the signal came after the last periodic checkpoint
    over2 = [o for o in over if not o.startswith("trainer.max_steps")]
    over2.append(f"trainer.max_steps={step + 2}")
    res = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *over2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resume {hpc}" in res.stdout
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == step + 2


def test_distill_vllm_sbatch_gives_each_task_of_each_node_its_own_shard(tmp_path):
    """Array task 1 of 2, 2 tasks per node: the tasks distil shards 2 and 3 of 4 (the batches
    b with b % 4 in {2, 3}). Run with the tiny target and the HF engine under the fake srun:
    the shard arithmetic and the argument passing are what is tested, not vLLM."""
    import json

    src = tmp_path / "c.jsonl"
    rows = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(8)
    ]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    env = slurm_env(tmp_path, 2)
    env.update(SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_COUNT="2", OMP_NUM_THREADS="1")
    over = [
        "target=tiny", f"source={src}", "split=null", "max_conversations=null",
        "generation.max_new_tokens=2", "generation.batch_size=1", f"out_dir={out}",
        f"paths.log_dir={tmp_path / 'logs'}",
    ]  # fmt: skip
    res = subprocess.run(
        ["bash", str(ROOT / "slurm" / "distill_vllm.sbatch"), *over],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    done = sorted(int(p.stem.split("-")[1]) for p in (out / "shards").glob("batch-*.json"))
    assert done == [2, 3, 6, 7]
    assert not (out / "dataset").exists()  # an array's merge is a job of its own
