"""Coverage of draft vocabularies (docs/design.md section 10) on a distilled corpus.

    python benchmarks/draft_vocab_coverage.py data/distilled/smollm2_135m/train \
        --sizes 4096 8192 16384

The vocabulary is built as training builds it: the V_d most frequent answer tokens (loss-masked:
what a drafter learns to predict) of the training examples; coverage is the share of answer
tokens inside it, on those training examples and on the held-out validation examples (the
split training validates on: data.val_fraction, by conversation id). A token outside the
vocabulary can never be drafted. Prints a markdown table.
"""

from __future__ import annotations

import argparse

from drafters.models.vocab import coverage, top_ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dataset_dir")
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--target", default="smollm2_135m", help="drafters.load_target spec")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--max-train-tokens", type=int, default=None)
    args = p.parse_args()

    from drafters import load_target
    from drafters.training.datamodule import DistilledDataModule

    target = load_target(args.target)
    dm = DistilledDataModule(
        args.dataset_dir,
        max_length=args.max_length,
        val_fraction=args.val_fraction,
        max_train_tokens=args.max_train_tokens,
    ).attach(target)
    train, val = dm.token_counts("train"), dm.token_counts("validation")
    print(
        f"{args.dataset_dir}: {len(dm.train_set)} training examples, {int(train.sum())} answer "
        f"tokens, {int((train > 0).sum())} distinct ids of {target.vocab_size}; validation: "
        f"{len(dm.val_set)} examples, {int(val.sum())} answer tokens (max_length "
        f"{args.max_length})\n"
    )
    print("| V_d | share of V | coverage, training answers | coverage, held-out answers |")
    print("|---:|---:|---:|---:|")
    for size in args.sizes:
        ids = top_ids(train, size)
        print(
            f"| {size} | {size / target.vocab_size:.3f} | {coverage(train, ids):.4f} | "
            f"{coverage(val, ids):.4f} |"
        )


if __name__ == "__main__":
    main()
