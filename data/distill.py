"""Self-distil ShareGPT with the target: `python data/distill.py [overrides]`."""

import os
from pathlib import Path

import hydra

os.environ.setdefault("DRAFTERS_ROOT", str(Path(__file__).resolve().parents[1]))

from drafters.data.distillation import distill  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="distill")
def main(cfg) -> None:
    distill(cfg)


if __name__ == "__main__":
    main()
