"""`train(cfg)`: the composed Hydra config in, a trained drafter checkpoint out.

`train.py` is a thin `@hydra.main` wrapper around this function, so tests run the real thing
on a composed config. Everything a restart must find again lives in `cfg.run_dir`:
`checkpoints/last.ckpt`, `wandb_id.txt`, `csv/metrics.csv`. Callbacks and loggers are the
`_target_` entries of the `callbacks` and `logger` config groups (conf/callbacks/,
conf/logger/), the lightning-hydra-template shape: add, drop or swap them from the command line.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from drafters.models import CerberusConfig, FalconConfig, MedusaConfig
from drafters.target import Target
from drafters.training.module import DrafterLitModule


def drafter_config(kind: str, overrides: dict, target: Target) -> dict:
    """The drafter's full config: shapes from the target, the rest from `drafter.model`."""
    if kind == "falcon":
        cfg = FalconConfig.from_target_config(target.config, **overrides)
    else:
        cls = {"medusa": MedusaConfig, "cerberus": CerberusConfig}[kind]
        cfg = cls(hidden_size=target.hidden_size, vocab_size=target.vocab_size, **overrides)
    return dataclasses.asdict(cfg)


def build_module(cfg: DictConfig, target: Target) -> DrafterLitModule:
    d = OmegaConf.to_container(cfg.drafter, resolve=True)
    return DrafterLitModule(
        kind=d["kind"],
        model=drafter_config(d["kind"], d.get("model") or {}, target),
        loss=d.get("loss"),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        csgd=d.get("csgd"),
        gate=d.get("gate"),
        gate_hidden_dim=d.get("gate_hidden_dim", 256),
        target=target.identity.to_dict(),
    ).attach(target)


class FinalLastCheckpoint(Callback):
    """last.ckpt holds the final step when training ends. ModelCheckpoint saves it only with a
    periodic save, so a run whose max_steps is not a multiple of every_n_train_steps would end
    with last.ckpt (what drafters-export and `ckpt_path=last` read) up to n - 1 steps behind.
    It writes `last.ckpt` in the dirpath of the trainer's ModelCheckpoint, and nothing when that
    has save_last off (or there is none): conf/callbacks/final_last_checkpoint.yaml."""

    def __init__(self) -> None:
        self.saved_step = -1

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        self.saved_step = trainer.global_step  # any checkpoint: periodic, last, pre-emption

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ckpt = trainer.checkpoint_callback
        if not isinstance(ckpt, ModelCheckpoint) or not ckpt.save_last or not ckpt.dirpath:
            return
        if trainer.global_step > 0 and self.saved_step != trainer.global_step:
            # every rank calls it; the strategy writes once
            trainer.save_checkpoint(Path(ckpt.dirpath) / "last.ckpt")


def batch_size(batch: dict) -> int:
    """Sequences in a batch (ThroughputMonitor's batch_size_fn)."""
    return int(batch["input_ids"].shape[0])


def batch_tokens(batch: dict) -> int:
    """Tokens in a batch, prompt and answer, as train/tokens_per_s counts them (length_fn)."""
    return int(batch["attention_mask"].sum())


def instantiate_group(group: DictConfig | None, what: str) -> list:
    """The objects of a `callbacks` or `logger` config: each entry with a `_target_`,
    instantiated; an entry set to null, or one that makes None (W&B with mode=disabled), is
    left out."""
    out = []
    for key, conf in (group or {}).items():
        if conf is None:
            continue
        if not (isinstance(conf, DictConfig) and "_target_" in conf):
            raise TypeError(f"{what}.{key} has no _target_: {conf!r}")
        obj = instantiate(conf)
        if obj is not None:
            out.append(obj)
    return out


def build_strategy(cfg: DictConfig):
    s = cfg.get("strategy")
    if s is None or "_target_" not in s:
        return (s or {}).get("name", "auto")
    return instantiate(s)


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """`last`: the newest of this run's `checkpoints/last.ckpt` and the `hpc_ckpt_N.ckpt` that
    Lightning writes on SLURM's pre-emption signal; None on a first start."""
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        found = [run_dir / "checkpoints" / "last.ckpt", *run_dir.glob("hpc_ckpt_*.ckpt")]
        found = [p for p in found if p.is_file()]
        return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None
    if not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path!r} does not exist")
    return ckpt_path


def train(cfg: DictConfig) -> dict:
    """Train the configured drafter; returns the final callback metrics (floats)."""
    # Our batch sampler resumes mid-epoch from the trainer's own progress counters
    # (DistilledDataModule), which Lightning cannot see: its warning does not apply.
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended")
    L.seed_everything(cfg.seed, workers=True)
    run_dir = Path(cfg.run_dir)
    target: Target = instantiate(cfg.target)
    datamodule = instantiate(cfg.data).attach(target)
    module = build_module(cfg, target)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        strategy=build_strategy(cfg),
        logger=instantiate_group(cfg.get("logger"), "logger"),
        callbacks=instantiate_group(cfg.get("callbacks"), "callbacks"),
        default_root_dir=str(run_dir),
    )
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, run_dir)
    env = getattr(trainer.strategy, "cluster_environment", None)
    print(
        f"[train] rank {trainer.global_rank}/{trainer.world_size} "
        f"(node {trainer.node_rank}, local {trainer.local_rank}), "
        f"cluster {type(env).__name__ if env else 'none'}, run_dir {run_dir}, "
        f"resume {ckpt_path or 'no'}",
        flush=True,
    )
    if trainer.global_rank == 0:
        for lg in trainer.loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}
