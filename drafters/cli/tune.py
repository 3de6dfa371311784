"""drafters-tune: the decoder's knobs on held-out ShareGPT (drafters/eval/tune.py)."""

from __future__ import annotations

import argparse


def tune_args(argv: list[str] | None = None) -> argparse.Namespace:
    from drafters.eval import tune as eval_tune

    p = argparse.ArgumentParser(prog="drafters-tune", description=eval_tune.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--drafter", action="append", default=[], help="exported drafter folder")
    p.add_argument("--peers", action="store_true", help="sweep the HF peers' knobs")
    p.add_argument("--out", required=True)
    p.add_argument("--target", default=None, help="default: the drafters' target")
    p.add_argument("--sizes", type=int, nargs="+", default=[3, 5, 8, 16], help="tree nodes")
    p.add_argument("--no-snap", dest="snap", action="store_false",
                   help="keep --sizes (default: each moved below a cost step)")  # fmt: skip
    p.add_argument("--topk", type=int, default=10)
    p.add_argument("--no-dynamic", dest="dynamic", action="store_false",
                   help="leave the dynamic trees out of the sweep")  # fmt: skip
    p.add_argument("--prompts", type=int, default=4, help="ShareGPT validation prompts")
    p.add_argument("--max-prompt-tokens", type=int, default=384)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--prompt-lookup", type=int, nargs="+", default=[3, 5, 10])
    p.add_argument("--early-exit-fractions", type=float, nargs="+", default=[0.1, 0.2, 0.33])
    p.add_argument("--early-exit-tokens", type=int, nargs="+", default=[3, 20],
                   help="num_assistant_tokens (HF's default: 20)")  # fmt: skip
    p.add_argument("--early-exit-thresholds", type=float, nargs="+", default=[0.0, 0.4, 0.7],
                   help="assistant_confidence_threshold (HF's default: 0.4; 0: off)")  # fmt: skip
    # where `python data/distill.py` and `python data/cache_features.py` put them, run from the
    # repository root with the embedded target
    p.add_argument("--dataset-dir", default="data/distilled/smollm2_135m/train",
                   help="the distilled corpus the drafters were trained on")  # fmt: skip
    p.add_argument("--cache-dir", default="data/features/smollm2_135m",
                   help="its offline feature cache")  # fmt: skip
    p.add_argument("--max-length", type=int, default=512, help="as the training runs")
    p.add_argument("--val-fraction", type=float, default=0.05, help="as the training runs")
    p.add_argument("--sharegpt-val-fraction", type=float, default=0.02, help="as distillation")
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args(argv)


def tune_main(argv: list[str] | None = None) -> int:
    from drafters.eval.tune import tune as run_tune

    run_tune(tune_args(argv))
    return 0
