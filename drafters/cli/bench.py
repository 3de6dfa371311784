"""drafters-bench: the Spec-Bench style benchmark (drafters/eval/bench.py), and
drafters-bench-vllm: the same prompts through vLLM (drafters/eval/vllm_bench.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from drafters.cli.common import parse_tree


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected INDEX/COUNT, e.g. 0/2") from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"{text!r}: INDEX must be in 0..COUNT-1")
    return index, count


def bench_args(argv: list[str] | None = None):
    from drafters.eval import bench as eval_bench
    from drafters.eval.methods import BUILTIN_METHODS, GATE_CHOICES
    from drafters.eval.questions import EVAL_DIR

    p = argparse.ArgumentParser(
        prog="drafters-bench",
        description=eval_bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bench", choices=["mt_bench", "spec_bench"], default="mt_bench")
    p.add_argument(
        "--eval-dir",
        default=str(EVAL_DIR),
        help="holds <bench>_question.jsonl (default: the copies shipped in drafters/eval/prompts)",
    )
    p.add_argument(
        "--questions",
        default=None,
        metavar="FILE",
        help="run this prompt file instead (same format: question_id, category, turns per line)",
    )
    p.add_argument("--per-category", type=int, default=None, help="questions per category")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-category sample")
    p.add_argument("--turns", type=int, choices=[1, 2], default=1)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1, help="questions run untimed first")
    p.add_argument(
        "--methods",
        nargs="*",
        choices=BUILTIN_METHODS,
        default=["hf_greedy", "ar"],
        help="built-in methods (hf_greedy is the baseline of speedup and lossless)",
    )
    p.add_argument(
        "--drafter",
        action="append",
        default=[],
        help="exported drafter folder, optionally @GATE[,GATE..] for its own gate variants",
    )
    p.add_argument(
        "--gates",
        nargs="+",
        choices=GATE_CHOICES,
        default=["none", "default"],
        help="gate variants per head drafter (default: without gate and with its own gate)",
    )
    p.add_argument(
        "--tree",
        default=None,
        help="decode every drafter whose gate builds no dynamic tree with this tree instead of "
        "its exported one: preset, chain<K> (e.g. chain2 beside vLLM's 2 draft tokens), JSON paths",
    )
    p.add_argument("--prompt-lookup", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument(
        "--early-exit-layer", type=int, default=None, help="assistant_early_exit (default L/5)"
    )
    p.add_argument(
        "--early-exit-tokens", type=int, default=None, help="num_assistant_tokens (HF: 20)"
    )
    p.add_argument(
        "--early-exit-threshold",
        type=float,
        default=None,
        help="assistant_confidence_threshold: the draft stops below this probability (HF: 0.4)",
    )
    p.add_argument("--target", default=None, help="smollm2_135m | tiny | HF id/folder")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="target dtype (default float32 on the CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--out", default="bench_results", help="output folder (resumed if it exists)")
    p.add_argument(
        "--shard",
        type=parse_shard,
        default=(0, 1),
        help="INDEX/COUNT: run questions INDEX, INDEX+COUNT..",
    )
    p.add_argument("--merge", action="store_true", help="only write the reports of --out")
    args = p.parse_args(argv)
    args.tree = parse_tree(args.tree)  # None: each drafter's exported tree
    return args


def bench_main(argv: list[str] | None = None) -> int:
    from drafters.eval.bench import run as run_bench
    from drafters.eval.records import merge

    args = bench_args(argv)
    result = merge(Path(args.out)) if args.merge else run_bench(args)
    print(result["markdown"])
    if result["files"]:
        print(f"\nwritten to {args.out}: " + ", ".join(result["files"]))
    return 0


def bench_vllm_main(argv: list[str] | None = None) -> int:
    from drafters.eval.vllm_bench import main

    return main(argv)
