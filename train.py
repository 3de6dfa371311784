"""Train a drafter: `python train.py [+experiment=NAME] [overrides]` (conf/train.yaml)."""

import os
from pathlib import Path

import hydra

os.environ.setdefault("DRAFTERS_ROOT", str(Path(__file__).resolve().parent))

from drafters.training.run import train  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
