"""`train(cfg)`: the composed Hydra config in, a trained drafter checkpoint out.

`train.py` is a thin `@hydra.main` wrapper around this function, so tests run the real thing
on a composed config. Everything a restart must find again lives in `cfg.run_dir`:
`checkpoints/last.ckpt`, `wandb_id.txt`, `csv/metrics.csv`. Callbacks and loggers are the
`_target_` entries of the `callbacks` and `logger` config groups (conf/callbacks/,
conf/logger/), the lightning-hydra-template shape: add, drop or swap them from the command line.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from drafters.io_utils import write_json_atomic
from drafters.models import CerberusConfig, FalconConfig, MedusaConfig
from drafters.models.vocab import coverage
from drafters.target import Target
from drafters.training.checks import (
    check_config,
    check_dataset_identity,
    claim_run_dir,
    global_rank,
    require_dataset,
)
from drafters.training.module import DrafterLitModule
from drafters.training.precision import resolve_precision


def drafter_config(kind: str, overrides: dict, target: Target) -> dict:
    """The drafter's full config: shapes from the target, the rest from `drafter.model`.

    A draft vocabulary as large as the target's (a tiny test target) is no subset: the full
    vocabulary is used, and said so."""
    size = overrides.get("draft_vocab_size")
    if size is not None and int(size) >= target.vocab_size:
        print(
            f"[train] drafter.model.draft_vocab_size={size} >= the target's vocabulary "
            f"({target.vocab_size}): drafting over the full vocabulary",
            flush=True,
        )
        overrides = {**overrides, "draft_vocab_size": None}
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


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint (periodic and best-k saves), with one `last.ckpt` per run:

    - last.ckpt is overwritten in place, never versioned into last-v1.ckpt, last-v2.ckpt... on a
      restart or requeue (at 7B, ~5 GB each with the optimizer state);
    - it holds the final step when training ends, even when max_steps is not a multiple of
      every_n_train_steps (Lightning saves the last one at the end only if it never saved one);
    - when training ends the pre-emption checkpoints Lightning left in the run folder
      (hpc_ckpt_N.ckpt) are older than last.ckpt, and deleted (`prune_preemption_checkpoints`
      also keeps only the newest one when a requeued job starts).
    conf/callbacks/checkpoint.yaml."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(**kwargs)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.save_last and 0 < trainer.global_step != self._last_global_step_saved:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        if self.save_last and trainer.is_global_zero:
            prune_preemption_checkpoints(Path(trainer.default_root_dir), keep=None)


def prune_preemption_checkpoints(run_dir: Path, keep: str | None) -> None:
    """Delete the run folder's hpc_ckpt_N.ckpt (one per SLURM pre-emption, ~5 GB each at 7B)
    but `keep`, the one a requeued job resumes from; a run that ends keeps none."""
    for old in run_dir.glob("hpc_ckpt_*.ckpt"):
        if keep is None or old.resolve() != Path(keep).resolve():
            shutil.rmtree(old) if old.is_dir() else old.unlink()


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


def is_checkpoint(path: Path) -> bool:
    """A Lightning checkpoint file, or the folder DeepSpeed writes in its place (Lightning's
    DeepSpeedStrategy: `last.ckpt/` with `latest` and `checkpoint/` inside)."""
    return path.is_file() or (path.is_dir() and (path / "latest").is_file())


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """`last`: the newest of this run's `checkpoints/last.ckpt` and the `hpc_ckpt_N.ckpt` that
    Lightning writes on SLURM's pre-emption signal, file or DeepSpeed folder; None on a first
    start."""
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        found = [run_dir / "checkpoints" / "last.ckpt", *run_dir.glob("hpc_ckpt_*.ckpt")]
        found = [p for p in found if is_checkpoint(p)]
        return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None
    path = Path(ckpt_path).expanduser()
    if not is_checkpoint(path):
        raise FileNotFoundError(
            f"ckpt_path={ckpt_path!r} is not a checkpoint file or DeepSpeed checkpoint folder"
        )
    return str(path)


def setup_draft_vocab(module: DrafterLitModule, datamodule, run_dir: Path) -> dict | None:
    """Build the drafter's draft vocabulary from the training answers' token counts; its
    coverage of the training and validation answers goes to the log and to
    `run_dir/draft_vocab.json`. None without a draft vocabulary."""
    vocab = module.drafter.vocab
    if vocab is None:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    counts = datamodule.token_counts("train")
    ids = module.init_draft_vocab(counts)
    val = datamodule.token_counts("validation")
    info = {
        "size": vocab.size,
        "target_vocab_size": vocab.vocab_size,
        "train_answer_tokens": int(counts.sum()),
        "train_distinct_tokens": int((counts > 0).sum()),
        "coverage_train": round(coverage(counts, ids), 6),
        "validation_answer_tokens": int(val.sum()),
        "coverage_validation": round(coverage(val, ids), 6),
    }
    print(f"[train] draft vocabulary: {json.dumps(info)}", flush=True)
    if global_rank() == 0:
        write_json_atomic(run_dir / "draft_vocab.json", info)
    return info


def train(cfg: DictConfig) -> dict:
    """Train the configured drafter; returns the final callback metrics (floats)."""
    # Our batch sampler resumes mid-epoch from the trainer's own progress counters
    # (DistilledDataModule), which Lightning cannot see: its warning does not apply.
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended")
    check_config(cfg)
    require_dataset(cfg.data.dataset_dir, cfg.data.get("distill_command", "python data/distill.py"))
    check_dataset_identity(cfg)
    run_dir = Path(cfg.run_dir)
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, run_dir)
    claim_run_dir(run_dir, resuming=cfg.ckpt_path not in (None, "", "null"),
                  overwrite=bool(cfg.get("overwrite", False)))  # fmt: skip
    if ckpt_path is not None and global_rank() == 0:
        prune_preemption_checkpoints(run_dir, keep=ckpt_path)
    L.seed_everything(cfg.seed, workers=True)
    target: Target = instantiate(cfg.target)
    datamodule = instantiate(cfg.data).attach(target)
    module = build_module(cfg, target)
    setup_draft_vocab(module, datamodule, run_dir)  # a resumed run gets its ids from the ckpt
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        precision=resolve_precision(cfg.trainer.precision, cfg.trainer.get("accelerator", "cpu")),
        strategy=build_strategy(cfg),
        logger=instantiate_group(cfg.get("logger"), "logger"),
        callbacks=instantiate_group(cfg.get("callbacks"), "callbacks"),
        default_root_dir=str(run_dir),
    )
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
    finish_wandb(trainer)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def finish_wandb(trainer: L.Trainer) -> None:
    """Close this run's W&B run (flushing an offline one): otherwise the next train() in the
    same process (a Hydra multirun, a notebook) would log into it, artifact included."""
    from lightning.pytorch.loggers import WandbLogger

    if any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
        import wandb

        if wandb.run is not None:
            wandb.finish()
