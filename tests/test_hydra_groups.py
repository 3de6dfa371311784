"""Callbacks and loggers are `_target_` config groups (conf/callbacks/, conf/logger/): every
shipped option composes and instantiates, and the commands their headers show build a Trainer
with those callbacks and loggers."""

import os
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ThroughputMonitor,
)
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from omegaconf import OmegaConf
from train_helpers import ROOT, compose_config, tiny_overrides

from drafters.training.loggers import AppendingCSVLogger
from drafters.training.publish import PublishDrafter
from drafters.training.run import RunCheckpoint, instantiate_group, train

CALLBACKS = sorted(p.stem for p in (ROOT / "conf" / "callbacks").glob("*.yaml"))
LOGGERS = sorted(p.stem for p in (ROOT / "conf" / "logger").glob("*.yaml"))


def base(tmp_path, tiny_distilled, *extra):
    """tiny_overrides without its logger choice, so a test can pick one."""
    over = tiny_overrides(tmp_path, tiny_distilled, *extra)
    return [o for o in over if o != "logger=csv"]


@pytest.fixture
def no_wandb_env(monkeypatch):
    for k in [k for k in os.environ if k.startswith("WANDB")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.fixture
def built(monkeypatch):
    """The Trainer that train() fits."""
    seen = []
    fit = L.Trainer.fit

    def spy(self, *a, **k):
        seen.append(self)
        return fit(self, *a, **k)

    monkeypatch.setattr(L.Trainer, "fit", spy)
    return seen


def test_default_groups_are_the_old_callbacks_and_loggers(tmp_path, tiny_distilled, no_wandb_env):
    cfg = compose_config("train", base(tmp_path, tiny_distilled))
    assert list(cfg.callbacks) == [
        "checkpoint", "best_checkpoint", "early_stopping", "lr_monitor", "publish"
    ]  # fmt: skip
    cbs = instantiate_group(cfg.callbacks, "callbacks")
    ckpt = next(c for c in cbs if isinstance(c, RunCheckpoint))
    assert Path(ckpt.dirpath) == (Path(cfg.run_dir) / "checkpoints").resolve()
    assert ckpt._every_n_train_steps == 200 and ckpt.save_top_k == 0 and ckpt.save_last
    best = next(c for c in cbs if type(c) is ModelCheckpoint)
    assert best.monitor == "val/accept_len_est" and best.mode == "max" and best.save_top_k == 1
    assert best.filename == "best" and not best.save_last
    assert Path(best.dirpath) == Path(ckpt.dirpath)
    es = next(c for c in cbs if isinstance(c, EarlyStopping))
    assert es.monitor == "val/accept_len_est" and es.mode == "max"
    pub = next(c for c in cbs if isinstance(c, PublishDrafter))
    assert pub.out_dir == Path(cfg.run_dir) / "drafter"
    assert [p.name for p in pub.checkpoints] == ["best.ckpt", "last.ckpt"]
    lr = next(c for c in cbs if isinstance(c, LearningRateMonitor))
    assert lr.logging_interval == "step"
    loggers = instantiate_group(cfg.logger, "logger")
    assert [type(lg) for lg in loggers] == [WandbLogger, AppendingCSVLogger]  # W&B first
    w = loggers[0]
    assert w._wandb_init["id"] == (Path(cfg.run_dir) / "wandb_id.txt").read_text().strip()
    assert w._wandb_init["resume"] == "allow" and w._offline
    assert w._wandb_init["project"] == "drafters" and w._wandb_init["name"] == cfg.run_name
    assert Path(loggers[1].log_dir) == Path(cfg.run_dir) / "csv"


@pytest.mark.parametrize("name", CALLBACKS)
def test_every_callbacks_option_composes_and_instantiates(name, tmp_path, tiny_distilled):
    cfg = compose_config("train", base(tmp_path, tiny_distilled, f"callbacks={name}", "logger=csv"))
    cbs = instantiate_group(cfg.callbacks, "callbacks")
    assert cbs and all(isinstance(c, L.Callback) for c in cbs)


@pytest.mark.parametrize("name", LOGGERS)
def test_every_logger_option_composes_and_instantiates(
    name, tmp_path, tiny_distilled, no_wandb_env
):
    cfg = compose_config("train", base(tmp_path, tiny_distilled, f"logger={name}"))
    loggers = instantiate_group(cfg.logger, "logger")
    assert len(loggers) == len(cfg.logger) and "csv" in cfg.logger  # the CSV copy, always


def test_disabled_wandb_and_debug_fast_leave_wandb_out(tmp_path, tiny_distilled):
    cfg = compose_config("train", base(tmp_path, tiny_distilled, "logger.wandb.mode=disabled"))
    assert [type(lg) for lg in instantiate_group(cfg.logger, "logger")] == [AppendingCSVLogger]
    assert not (Path(cfg.run_dir) / "wandb_id.txt").exists()
    cfg = compose_config("train", base(tmp_path, tiny_distilled, "debug=fast"))
    assert cfg.logger.wandb is None
    assert [type(lg) for lg in instantiate_group(cfg.logger, "logger")] == [AppendingCSVLogger]


def test_an_entry_without_target_is_an_error(tmp_path, tiny_distilled):
    cfg = compose_config("train", base(tmp_path, tiny_distilled, "logger=csv", "+callbacks.oops=1"))
    with pytest.raises(TypeError, match="callbacks.oops"):
        instantiate_group(cfg.callbacks, "callbacks")


def test_tensorboard_early_stopping_and_throughput_from_the_command_line(
    tmp_path, tiny_distilled, built
):
    over = base(
        tmp_path,
        tiny_distilled,
        "logger=tensorboard",
        "callbacks=[default,throughput_monitor]",
        "callbacks.early_stopping.patience=5",
        "callbacks.throughput_monitor.window_size=2",
        "~callbacks.lr_monitor",
        "+callbacks.summary._target_=lightning.pytorch.callbacks.ModelSummary",
    )
    cfg = compose_config("train", over)
    metrics = train(cfg)
    (trainer,) = built
    assert [type(lg) for lg in trainer.loggers] == [TensorBoardLogger, AppendingCSVLogger]
    kinds = {type(c).__name__ for c in trainer.callbacks}
    assert {"RunCheckpoint", "EarlyStopping", "ThroughputMonitor"} <= kinds
    assert "ModelSummary" in kinds and "LearningRateMonitor" not in kinds
    es = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping))
    assert es.monitor == "val/accept_len_est" and es.patience == 5
    assert any(isinstance(c, ThroughputMonitor) for c in trainer.callbacks)
    run_dir = Path(cfg.run_dir)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    header = (run_dir / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "train/tokens_per_s" in header and "train/device/items_per_sec" in header
    assert "val/loss" in metrics and (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_save_last_off_writes_no_last_checkpoint(tmp_path, tiny_distilled):
    over = tiny_overrides(
        tmp_path,
        tiny_distilled,
        "callbacks.checkpoint.save_last=false",
        "callbacks.checkpoint.every_n_train_steps=2",
    )
    cfg = compose_config("train", over)
    train(cfg)
    names = sorted(p.name for p in (Path(cfg.run_dir) / "checkpoints").iterdir())
    assert names and "last.ckpt" not in names


def test_every_shipped_entry_is_a_target():
    """The settings of each callback and logger live in its one yaml file, as a `_target_`."""
    for group in ("callbacks", "logger"):
        for path in (ROOT / "conf" / group).glob("*.yaml"):
            for key, conf in OmegaConf.load(path).items():
                if key != "defaults":
                    assert "_target_" in conf, f"{path.name}: {key} has no _target_"
