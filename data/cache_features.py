"""Compute the target's features once for offline training: `python data/cache_features.py`.

Takes the same overrides as `train.py` (target, data, +experiment=...), so the cache matches
the run that will read it with `data.features=offline`. Resumes if interrupted.
"""

import os
from pathlib import Path

import hydra

os.environ.setdefault("DRAFTERS_ROOT", str(Path(__file__).resolve().parents[1]))

from drafters.training.feature_cache import cache_features  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg) -> None:
    cache_features(cfg)


if __name__ == "__main__":
    main()
