"""The chosen drafter of a run: exported when training ends, and logged as a W&B artifact.

Training keeps `checkpoints/best.ckpt`, the checkpoint with the best held-out acceptance
estimate `val/accept_len_est` (conf/callbacks/best_checkpoint.yaml), and stops early when it
stops improving (early_stopping.yaml). When fit ends, `PublishDrafter`
(conf/callbacks/publish.yaml) exports that checkpoint (last.ckpt when no validation ran) to
`run_dir/drafter` with `drafters.export.export_checkpoint` and, when the run logs to W&B, logs
the folder as a `model` artifact with the step, the checkpoint and its `val/accept_len_est` as
metadata (offline runs keep it in the offline run folder until `wandb sync`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger

from drafters.training.run import is_checkpoint


class PublishDrafter(Callback):
    def __init__(
        self,
        out_dir: str,
        checkpoints: list[str],
        tree: Any = None,
        dtype: str = "float32",
        artifact_name: str | None = None,
        monitor: str = "val/accept_len_est",
    ):
        self.out_dir = Path(out_dir)
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

        ckpt = self.chosen_checkpoint()
        if ckpt is None:
            print("[train] no checkpoint to export (none of: "
                  f"{', '.join(map(str, self.checkpoints))})", flush=True)  # fmt: skip
            return
        folder = export_checkpoint(ckpt, self.out_dir, self.dtype, self.tree, overwrite=True)
        meta = self._metadata(ckpt)
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
