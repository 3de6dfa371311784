"""What `train(cfg)` settles before it loads the target (at 7B a load takes minutes and 13 GB):
the settings that would otherwise train nothing or fail late, the dataset's presence and the
target it was distilled by, and the run folder, which holds one run.

One run per folder: a fresh start (ckpt_path=null) in a folder that already holds a run's
outputs is refused, naming `ckpt_path=last` (resume it) and `overwrite=true` (start over: the old
outputs are deleted first). Under Hydra multirun each job gets its own folder, named by its
overrides (`job_dir` below), so the jobs of a sweep never share one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import DictConfig

SCHEDULES = ("cosine", "linear", "constant")
# what a run writes into its folder; Hydra's own .hydra/ and *.log are not a run's outputs
RUN_OUTPUTS = ("checkpoints", "csv", "wandb", "wandb_id.txt", "tensorboard", "hpc_ckpt_*.ckpt")


class ConfigError(ValueError):
    """A setting that cannot work, named with the fix."""


def check_config(cfg: DictConfig) -> None:
    """The numbers and names of a training config, before anything heavy happens."""
    data, optim, trainer = cfg.data, cfg.optim, cfg.trainer
    problems = []
    if not isinstance(data.batch_size, int) or data.batch_size < 1:
        problems.append(f"data.batch_size={data.batch_size!r}: needs a whole number >= 1")
    if not isinstance(data.max_length, int) or data.max_length < 16:
        problems.append(
            f"data.max_length={data.max_length!r}: needs >= 16 tokens (a chat prompt alone "
            "is longer than that; 512 is the default)"
        )
    if not 0 < float(data.val_fraction) < 1:
        problems.append(f"data.val_fraction={data.val_fraction!r}: needs 0 < fraction < 1")
    if optim.get("schedule", "cosine") not in SCHEDULES:
        problems.append(f"optim.schedule={optim.schedule!r}: use one of {', '.join(SCHEDULES)}")
    if not float(optim.lr) > 0:
        problems.append(f"optim.lr={optim.lr!r}: needs > 0")
    if optim.get("warmup_steps") is not None and int(optim.warmup_steps) < 0:
        problems.append(f"optim.warmup_steps={optim.warmup_steps!r}: needs >= 0 (or null)")
    if not 0 <= float(optim.get("warmup_ratio", 0.0)) < 1:
        problems.append(f"optim.warmup_ratio={optim.warmup_ratio!r}: needs 0 <= ratio < 1")
    max_steps = trainer.get("max_steps", -1)
    if max_steps is not None and max_steps != -1 and max_steps < 1:
        problems.append(f"trainer.max_steps={max_steps!r}: needs >= 1 (or -1: epochs decide)")
    if problems:
        raise ConfigError("bad training config:\n  " + "\n  ".join(problems))


def require_dataset(dataset_dir: str | Path, distill_command: str) -> None:
    """The distilled dataset is there, or the command that makes it is named."""
    d = Path(dataset_dir)
    if not (d / "dataset").is_dir() and not (d / "drafters_meta.json").is_file():
        raise FileNotFoundError(
            f"no distilled dataset at {d}; make it first with:\n  {distill_command}"
        )


def check_dataset_identity(cfg: DictConfig) -> None:
    """The dataset's target against the configured one before the weights load: the target
    is built on the meta device (config, tokenizer, and a weights fingerprint read from its
    files) where its loader takes a device; a tiny test target is built in a moment anyway."""
    import inspect

    from hydra.utils import get_method, instantiate

    from drafters.data.corpus import check_dataset_target

    loader = get_method(cfg.target._target_)
    if "device" not in inspect.signature(loader).parameters:
        return
    probe = instantiate(cfg.target, device="meta")
    check_dataset_target(cfg.data.dataset_dir, probe.identity)


def run_outputs(run_dir: Path) -> list[Path]:
    return sorted(p for pattern in RUN_OUTPUTS for p in Path(run_dir).glob(pattern))


def global_rank() -> int:
    """This process's rank before the trainer exists: torchrun/DeepSpeed (RANK), SLURM
    (SLURM_PROCID), or a child Lightning launched (LOCAL_RANK on one node); 0 otherwise."""
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def claim_run_dir(run_dir: Path, resuming: bool, overwrite: bool) -> None:
    """Rank 0 only: refuse a fresh start over another run's outputs, or clear them with
    overwrite=true. Resuming (ckpt_path set) keeps everything."""
    if resuming or global_rank() != 0:
        return
    found = run_outputs(run_dir)
    if not found:
        return
    if not overwrite:
        names = ", ".join(p.name for p in found)
        raise ConfigError(
            f"{run_dir} already holds a run ({names}). Resume it with ckpt_path=last, start "
            "over in it with overwrite=true (deletes those), or pick another run_name=..."
        )
    for p in found:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def job_dir(run_dir: str) -> str:
    """`${job_dir:...}` in conf/train.yaml: the run folder as given for a single run; under
    multirun the job's own output folder, `logs/<task>/multirun/<its overrides>`
    (conf/hydra/default.yaml: hydra.job.override_dirname without ckpt_path, overwrite and paths,
    so a restart of the same sweep finds its folders again)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return run_dir
    return HydraConfig.get().runtime.output_dir
