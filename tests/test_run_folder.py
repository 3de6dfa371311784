"""One run per folder: multirun jobs get their own, a fresh start over a used folder is refused
(or cleared with overwrite=true), one last.ckpt per run whatever the restarts, DeepSpeed
checkpoint folders resume, and settings that would train nothing fail before the target loads."""

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import ROOT, compose_config, tiny_overrides

from drafters.training.checks import ConfigError
from drafters.training.run import resolve_ckpt_path, train


def overrides(tmp_path, dataset, *extra):
    return tiny_overrides(
        tmp_path, dataset, "trainer.max_epochs=3", "callbacks.checkpoint.every_n_train_steps=2",
        *extra,
    )  # fmt: skip


def lasts(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("last*"))


def test_a_fresh_start_over_a_used_folder_is_refused_until_told(tmp_path, tiny_distilled):
    cfg = compose_config("train", overrides(tmp_path, tiny_distilled, "trainer.max_steps=2"))
    train(cfg)
    with pytest.raises(ConfigError, match=r"ckpt_path=last.*overwrite=true"):
        train(compose_config("train", overrides(tmp_path, tiny_distilled, "trainer.max_steps=2")))
    over = overrides(tmp_path, tiny_distilled, "trainer.max_steps=3", "overwrite=true")
    train(compose_config("train", over))
    run_dir = Path(cfg.run_dir)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    rows = (run_dir / "csv" / "metrics.csv").read_text().splitlines()
    steps = [int(r.split(",")[rows[0].split(",").index("step")]) for r in rows[1:]]
    assert steps == sorted(steps)  # one run's rows: the first run's were deleted, not appended to


def test_one_last_checkpoint_across_restarts_and_requeues(tmp_path, tiny_distilled):
    cfg = compose_config("train", overrides(tmp_path, tiny_distilled, "trainer.max_steps=3"))
    train(cfg)  # 3 is not a multiple of every_n_train_steps=2: the end writes the final step
    run_dir = Path(cfg.run_dir)
    assert lasts(run_dir) == ["last.ckpt"]
    assert torch.load(run_dir / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 3
    # a SLURM pre-emption left hpc_ckpt_1.ckpt behind; the requeued job resumes from it
    shutil.copy(run_dir / "checkpoints/last.ckpt", run_dir / "hpc_ckpt_1.ckpt")
    for steps in (5, 6):
        train(compose_config("train", overrides(
            tmp_path, tiny_distilled, f"trainer.max_steps={steps}", "ckpt_path=last")))  # fmt: skip
        assert lasts(run_dir) == ["last.ckpt"]
        assert not list(run_dir.glob("hpc_ckpt_*"))
    assert torch.load(run_dir / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 6


def test_multirun_jobs_write_to_their_own_folders(tmp_path, tiny_distilled):
    cmd = [
        sys.executable, "train.py", "-m", "target=tiny", "debug=fast", "logger=csv",
        "trainer=cpu", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
        f"data.dataset_dir={tiny_distilled}", "data.max_length=64", "data.val_fraction=0.25",
        f"paths.log_dir={tmp_path / 'logs'}", "optim.warmup_steps=1", "optim.lr=1e-3,3e-3",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = sorted(p.parent.parent for p in (tmp_path / "logs/train").rglob("csv/metrics.csv"))
    assert len(jobs) == 2 and jobs[0] != jobs[1]
    # named by their overrides (a value with "/" in it nests, as in any Hydra sweep)
    multirun = tmp_path / "logs/train/multirun"
    assert all(multirun in j.parents for j in jobs)
    assert {str(j).split("optim.lr=")[1].split(",")[0] for j in jobs} == {"0.001", "0.003"}
    for j in jobs:
        assert lasts(j) == ["last.ckpt"] and (j / ".hydra" / "overrides.yaml").is_file()


def test_deepspeed_checkpoint_folders_resume(tmp_path):
    run_dir = tmp_path / "run"
    ds = run_dir / "checkpoints" / "last.ckpt"  # the layout Lightning's DeepSpeedStrategy writes
    (ds / "checkpoint").mkdir(parents=True)
    (ds / "latest").write_text("checkpoint")
    assert resolve_ckpt_path("last", run_dir) == str(ds)
    assert resolve_ckpt_path(str(ds), run_dir) == str(ds)
    (run_dir / "checkpoints" / "half.ckpt").mkdir()  # a folder without `latest` is no checkpoint
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        resolve_ckpt_path(str(run_dir / "checkpoints" / "half.ckpt"), run_dir)


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.batch_size=-1", "data.batch_size=-1"),
        ("data.max_length=4", "data.max_length=4"),
        ("optim.schedule=cosin", "optim.schedule='cosin'"),
        ("optim.lr=0", "optim.lr=0"),
        ("trainer.max_steps=0", "trainer.max_steps=0"),
    ],
)
def test_bad_settings_fail_before_the_target_loads(tmp_path, tiny_distilled, override, message,
                                                   monkeypatch):  # fmt: skip
    import drafters.training.run as R

    monkeypatch.setattr(R, "instantiate", lambda *a, **k: pytest.fail("the target was loaded"))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        train(compose_config("train", overrides(tmp_path, tiny_distilled, override)))


def test_a_missing_dataset_fails_before_the_target_loads(tmp_path, monkeypatch):
    import drafters.training.run as R

    monkeypatch.setattr(R, "instantiate", lambda *a, **k: pytest.fail("the target was loaded"))
    with pytest.raises(FileNotFoundError, match=r"(?s)no distilled dataset.*data/distill.py"):
        train(compose_config("train", overrides(tmp_path, tmp_path / "nothing")))


def test_a_max_length_that_keeps_no_answer_token_is_an_error(tmp_path, tiny_distilled):
    with pytest.raises(ValueError, match=r"no train example .* data\.max_length=16"):
        train(compose_config("train", overrides(tmp_path, tiny_distilled, "data.max_length=16")))


def test_a_corpus_of_another_target_is_refused_before_its_weights_load(
    tmp_path, tiny_distilled, monkeypatch
):
    from drafters import target as T
    from drafters.testing import tiny_target

    other = tiny_target(seed=1)  # same shapes and tokenizer, other weights
    folder = tmp_path / "seed1"
    other.model.save_pretrained(folder)
    other.tokenizer.save_pretrained(folder)
    devices = []
    real = T.from_pretrained

    @functools.wraps(real)  # keeps its signature: the probe asks whether it takes a device
    def spy(*args, **kwargs):
        devices.append(kwargs.get("device", "cpu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(T, "from_pretrained", spy)
    over = overrides(
        tmp_path, tiny_distilled, "target._target_=drafters.target.from_pretrained",
        f"+target.name_or_path={folder}", "~target.hidden_size", "~target.num_layers",
        "~target.num_heads", "~target.num_kv_heads", "~target.intermediate_size", "~target.seed",
        "+target.dtype=float32", "+target.name=saved-seed1",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"(?s)distilled dataset.*tiny-random-llama-seed0"):
        train(compose_config("train", over))
    assert devices == ["meta"]  # only the probe: no weights were loaded
