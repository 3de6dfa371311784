"""Compose the real Hydra config for tests (as `python train.py` would) with tiny overrides."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose(name, return_hydra_config=True, overrides=overrides)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # as in @hydra.main; ${hydra:...} still resolves through HydraConfig
    return cfg


# Falcon k=1 in EAGLE-3's layout reading the tiny target's layer 1 beside f (fused features)
EAGLE3_AUX = ("drafter=falcon", "drafter.model.k=1", "drafter.model.fusion=eagle3",
              "drafter.model.aux_layers=[1]")  # fmt: skip


def tiny_overrides(tmp_path, dataset_dir, *extra: str) -> list[str]:
    return [
        "target=tiny",
        f"data.dataset_dir={dataset_dir}",
        f"data.cache_dir={tmp_path / 'features'}",
        "data.max_length=64",
        "data.batch_size=4",
        "data.val_fraction=0.25",
        "trainer=cpu",
        "trainer.precision=32-true",  # not auto: the same numbers on every processor
        "trainer.max_steps=3",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=2",
        "trainer.enable_progress_bar=false",
        "optim.warmup_steps=1",
        "logger=csv",
        "strategy=auto",
        f"paths.log_dir={tmp_path / 'logs'}",
        *extra,
    ]


def load_script(path: str):
    """A repository script (benchmarks/*.py, not part of the package) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
