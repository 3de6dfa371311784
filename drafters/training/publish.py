"""The chosen drafter of a run: exported when training ends, and logged as a W&B artifact.

Training keeps `checkpoints/best.ckpt`, the checkpoint with the best held-out acceptance
estimate `val/accept_len_est` (conf/callbacks/best_checkpoint.yaml), and stops early when it
stops improving (early_stopping.yaml). When fit ends, `PublishDrafter`
(conf/callbacks/publish.yaml) exports that checkpoint (last.ckpt when no validation ran) to
`run_dir/drafter` with `drafters.export.export_checkpoint` and, when the run logs to W&B, logs
the folder as a `model` artifact with the step, the checkpoint and its `val/accept_len_est` as
metadata (offline runs keep it in the offline run folder until `wandb sync`). It also writes
`run_dir/fit_end.json`: how the fit ended (`fit_end`), so that a comparison can tell a run that
early stopping ended (converged by the rule) from one that hit the step cap or the epoch limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, Timer
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.loggers import WandbLogger

from drafters.io_utils import write_json_atomic
from drafters.training.run import is_checkpoint


def fit_end(trainer: L.Trainer) -> dict:
    """How a finished fit ended: `ended_by` early_stopping (the rule's patience ran out, or a
    non-finite metric: `reason`), max_steps (the cap), max_time, or max_epochs; the optimizer
    steps and the epochs they make (fractional: steps x accumulation / batches an epoch); the
    precision it trained in (`trainer.precision: auto` resolves per processor) and the machine."""
    from drafters.machine import describe

    out: dict[str, Any] = {"global_step": int(trainer.global_step),
                           "precision": str(trainer.precision), "machine": describe()}  # fmt: skip
    batches = trainer.num_training_batches
    if isinstance(batches, int) and batches > 0:
        out["epochs"] = round(trainer.global_step * trainer.accumulate_grad_batches / batches, 3)
    stops = [c for c in trainer.callbacks if isinstance(c, EarlyStopping)]
    stopped = [c for c in stops if c.stopping_reason != EarlyStoppingReason.NOT_STOPPED]
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    if stopped:
        out["ended_by"] = "early_stopping"
        out["reason"] = stopped[0].stopping_reason.name.lower()
    elif trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        out["ended_by"] = "max_steps"
    elif timers and timers[0].time_remaining() is not None and timers[0].time_remaining() <= 0:
        out["ended_by"] = "max_time"
    else:
        out["ended_by"] = "max_epochs"
    return out


class PublishDrafter(Callback):
    def __init__(
        self,
        out_dir: str,
        checkpoints: list[str],
        tree: Any = None,
        dtype: str = "float32",
        artifact_name: str | None = None,
        monitor: str = "val/accept_len_est",
        summary: str | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.summary = Path(summary) if summary else None  # fit_end.json
        self.checkpoints = [Path(p) for p in checkpoints]  # first that exists wins
        self.tree, self.dtype = tree, dtype
        self.artifact_name, self.monitor = artifact_name, monitor
        self.exported: dict | None = None

    def chosen_checkpoint(self) -> Path | None:
        return next((p for p in self.checkpoints if is_checkpoint(p)), None)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_fit_end, not on_train_end: Lightning runs the checkpoint callbacks' on_train_end
        # (the final last.ckpt) after every other callback's
        if not trainer.is_global_zero:
            return
        from drafters.export import export_checkpoint

        ended = fit_end(trainer)
        if self.summary is not None:
            write_json_atomic(self.summary, ended)
        print(f"[train] fit ended: {ended}", flush=True)
        ckpt = self.chosen_checkpoint()
        if ckpt is None:
            print("[train] no checkpoint to export (none of: "
                  f"{', '.join(map(str, self.checkpoints))})", flush=True)  # fmt: skip
            return
        folder = export_checkpoint(ckpt, self.out_dir, self.dtype, self.tree, overwrite=True)
        meta = {**self._metadata(ckpt), "fit_ended_by": ended["ended_by"]}
        self.exported = {"folder": str(folder), **meta}
        print(f"[train] exported {ckpt.name} -> {folder} ({meta})", flush=True)
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                self._log_artifact(lg, folder, meta)

    def _metadata(self, ckpt: Path) -> dict:
        meta: dict[str, Any] = {"checkpoint": ckpt.name}
        if ckpt.is_file():
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
            meta["global_step"] = int(state.get("global_step", -1))
            for cb_state in state.get("callbacks", {}).values():
                if cb_state.get("monitor") == self.monitor and "best_model_score" in cb_state:
                    score = cb_state["best_model_score"]
                    if score is not None:
                        meta[self.monitor] = round(float(score), 4)
        return meta

    def _log_artifact(self, logger: WandbLogger, folder: Path, meta: dict) -> None:
        import wandb

        run = logger.experiment
        name = self.artifact_name or f"{run.name or 'run'}-drafter"
        name = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
        art = wandb.Artifact(name, type="model", metadata=meta)
        art.add_dir(str(folder))
        run.log_artifact(art, aliases=["latest", "best"])
        print(f"[train] W&B artifact {name} logged", flush=True)
