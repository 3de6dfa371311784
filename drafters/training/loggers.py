"""Loggers whose history survives a restart of the same run (ckpt_path=last, SLURM requeue).

- W&B: the run id is made once per run folder and re-read on restart (`resume="allow"`), so a
  requeued job continues the same W&B run; offline mode when no API key is configured.
- CSV: Lightning's CSVLogger deletes `metrics.csv` when its folder is not empty; ours appends,
  so the rows of every start of the run stay in one file.

Both are the `_target_`s of conf/logger/ (wandb.yaml, csv.yaml), where their settings live.
"""

from __future__ import annotations

import csv
import netrc
import os
import uuid
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from drafters.io_utils import create_exclusive


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # Keep earlier rows; continue with the header they were written under.
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])


class AppendingCSVLogger(CSVLogger):
    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def wandb_mode(mode: str) -> str:
    """auto: online when an API key is configured (env or ~/.netrc), else offline."""
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") == "online":
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    return "offline"


def stable_run_id(run_dir: Path) -> str:
    """The W&B run id of this run folder: made once (by global rank 0), re-read on restart."""
    path = run_dir / "wandb_id.txt"
    if not path.is_file() and int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0))) == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        create_exclusive(path, uuid.uuid4().hex[:12])
    return path.read_text().strip() if path.is_file() else uuid.uuid4().hex[:12]


def wandb_logger(
    *, save_dir: str, name: str, project: str, entity: str | None, mode: str, tags, **kwargs
) -> WandbLogger | None:
    """conf/logger/wandb.yaml's `_target_` (its values are the defaults): a WandbLogger that
    continues this run folder's W&B run (`stable_run_id(save_dir)`, `resume="allow"`), in
    `wandb_mode(mode)`; None (no logger) for mode=disabled. Other WandbLogger args pass on."""
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    return WandbLogger(
        project=project,
        entity=entity,
        name=name,
        id=stable_run_id(Path(save_dir)),
        resume="allow",
        save_dir=str(save_dir),
        offline=mode == "offline",
        tags=list(tags),
        **kwargs,
    )
