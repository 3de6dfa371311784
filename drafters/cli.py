"""The console scripts (`[project.scripts]` in pyproject.toml), one function each:

    drafters-export    a training checkpoint -> an exported drafter folder
    drafters-generate  answer one prompt with speculative decoding; print tau, alpha, tokens/s
    drafters-bench     the Spec-Bench style benchmark (drafters/eval/bench.py)
    drafters-tune      the decoder's knobs on held-out ShareGPT (drafters/eval/tune.py)

`python -m drafters.cli COMMAND ARGS` runs the same (COMMAND: export, generate, bench, tune).
A bad input (a missing or corrupt file, a drafter of another target, a malformed prompt file,
a bad option value) prints one `error: ...` line and exits 1; DRAFTERS_TRACEBACK=1 shows the
traceback. `train.py` and `data/*.py` are the Hydra entry points; these are the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch


class UsageError(ValueError):
    """A bad command line or input file, said in one line the user can act on."""


def user_errors() -> tuple[type[BaseException], ...]:
    """What a bad input raises, as opposed to a bug (which keeps its traceback)."""
    from safetensors import SafetensorError

    from drafters.target import TargetError

    return (ValueError, OSError, TargetError, SafetensorError)


def parse_tree(spec: str | None):
    """--tree: a JSON list of paths, or a name / file the tree resolvers accept as is."""
    if spec is not None and spec.lstrip().startswith("["):
        try:
            return json.loads(spec)
        except json.JSONDecodeError as e:
            raise UsageError(f"--tree {spec!r} is not a JSON list of paths: {e}") from None
    return spec


def run(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    try:
        return main(argv)
    except user_errors() as e:
        if os.environ.get("DRAFTERS_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1


# ---- drafters-export -----------------------------------------------------------------------------

EXPORT_HELP = """Export a training checkpoint to a drafter folder (config.json + model.safetensors).

    drafters-export logs/train/cerberus_smollm2/checkpoints/last.ckpt outputs/cerberus_smollm2
    drafters-export CKPT OUT --dtype bfloat16 --tree mc_sim_7b_63_first16 --force

The folder loads with `drafters.load_drafter(OUT, target)` (no Lightning, no Hydra) and runs with
`drafters-generate --drafter OUT` and `drafters-bench --drafter OUT`.
Format: the docstring of drafters/export/format.py.

--format vllm writes a folder vLLM serves as the target's speculative model (Medusa heads; Falcon
with k=1 in EAGLE's layout), from a checkpoint or from an exported drafter folder:

    drafters-export outputs/medusa_smollm2 outputs/medusa_smollm2-vllm --format vllm --full-vocab
    LLM(model=TARGET, speculative_config={"method": "medusa", "model": OUT, ...})

--format speculators writes an EAGLE-3 drafter with fused target layers in vllm speculators'
format, which names its target (--verifier, default: the folder or hub id the drafter's target
loads from) so that vLLM serves the folder alone: `vllm serve OUT`.

What vLLM can and cannot express: the docstring of drafters/export/vllm.py.
"""


def export_main(argv: list[str] | None = None) -> int:
    from drafters.export import DTYPES, export_checkpoint

    p = argparse.ArgumentParser(
        prog="drafters-export",
        description=EXPORT_HELP,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument(
        "checkpoint",
        help="a Lightning checkpoint written by train.py (.ckpt); with --format vllm also an "
        "exported drafter folder",
    )
    p.add_argument("out", help="the drafter folder to write (atomically)")
    p.add_argument(
        "--format",
        choices=["drafters", "vllm", "speculators"],
        default="drafters",
        help="drafters: ours (the source of truth); vllm: what vLLM loads as speculative model; "
        "speculators: vllm speculators' format (EAGLE-3 with aux layers), served alone",
    )
    p.add_argument(
        "--verifier",
        default=None,
        help="--format speculators: the target's hub id or folder (default: where the drafter's "
        "target loads from)",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=3,
        help="--format speculators: draft tokens per step (its proposal method)",
    )
    p.add_argument(
        "--full-vocab",
        action="store_true",
        help="--format vllm: export a drafter trained with a draft vocabulary to score every "
        "target token (vLLM 0.32 loads no draft vocabulary)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights dtype")
    p.add_argument(
        "--tree",
        default=None,
        help="decoding tree: a preset (mc_sim_7b_63, mc_sim_7b_63_first16), chain<K>, a JSON "
        "list of paths, or a .json file holding paths or {topk_acc: [[...]], num_nodes: n}. "
        "Default: mc_sim_7b_63 for head drafters, the decoder's own for Falcon",
    )
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = p.parse_args(argv)
    if args.format in ("vllm", "speculators"):
        return export_vllm_main(args)
    out = export_checkpoint(
        args.checkpoint, args.out, args.dtype, parse_tree(args.tree), args.force
    )
    config = json.loads((out / "config.json").read_text())
    tree = config["tree"]["name"] or config["tree"]["spec"] or "decoder default"
    print(
        f"exported {config['kind']} drafter ({config['weights']['num_params']:,} parameters, "
        f"{config['weights']['dtype']}, tree {tree}, "
        f"gate {config['gate']['default']}) for target {config['target']['name']} to {out}"
    )
    return 0


def export_vllm_main(args) -> int:
    import tempfile
    from pathlib import Path

    from drafters.export import export_checkpoint, read_config
    from drafters.export.vllm import SOURCE_FILE, export_vllm

    source = Path(args.checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        if not source.is_dir():  # a checkpoint: our format first, then vLLM's
            source = export_checkpoint(source, Path(tmp) / "drafter", args.dtype)
        config = read_config(source)
        kind, verifier = config["kind"], None
        if args.format == "speculators":
            verifier = args.verifier or _target_path(config["target"])
        out = export_vllm(
            source, args.out, dtype=args.dtype, full_vocab=args.full_vocab, force=args.force,
            verifier=verifier, speculative_tokens=args.tokens,
        )  # fmt: skip
    if verifier is not None:
        print(f"exported {kind} drafter in vllm speculators' format to {out} (verifier "
              f"{verifier}): vllm serve {out}")  # fmt: skip
        return 0
    config = json.loads((out / "config.json").read_text())
    n = config.get("num_heads", "N")
    method = json.loads((out / SOURCE_FILE).read_text())["vllm_method"]
    print(
        f"exported {kind} drafter for vLLM to {out}: LLM(model=<target>, speculative_config="
        f'{{"method": "{method}", "model": "{out}", "num_speculative_tokens": {n}}})'
    )
    return 0


def _target_path(identity: dict) -> str:
    """The hub id or folder a drafter's target loads from (the converted folder of a packaged
    GGUF), which vLLM loads as the verifier."""
    from drafters.target import load_target

    target = load_target(None, identity=identity)
    return str(target.path or identity["name"])


# ---- drafters-generate ---------------------------------------------------------------------------

GENERATE_HELP = """Answer one prompt with speculative decoding and an exported drafter; print tau,
alpha, tokens/s.

    drafters-generate --drafter outputs/cerberus_smollm2 --prompt "Why is the sky blue?"
    drafters-generate --drafter DIR --prompt "..." --gate none --tree chain4
    drafters-generate --drafter DIR --prompt "..." --gate budget --nodes 3   # dynamic, 3 nodes

The target defaults to the one the drafter was trained for (its exported identity): the embedded
SmolLM2 for `HuggingFaceTB/SmolLM2-135M-Instruct`, else that name as an HF hub id or folder. The
prompt is rendered with the target's chat template as one user turn. The answer is printed once
decoding ends (with --stream: step by step, as tokens are accepted), then the statistics:
tau = new tokens per target verification forward, bonus token included (plain AR: 1);
alpha = accepted draft tokens / new tokens; tokens/s over prefill + decoding.
"""


def generate_main(argv: list[str] | None = None) -> int:
    from drafters.data.chat import render_prompt
    from drafters.decoding.dynamic import DynamicConfig
    from drafters.export import load_drafter, read_config
    from drafters.speculate import BUDGET_GATES, speculative_decode
    from drafters.target import load_target

    p = argparse.ArgumentParser(
        prog="drafters-generate",
        description=GENERATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--drafter", required=True, help="an exported drafter folder (drafters-export)")
    p.add_argument("--prompt", required=True, help="the user message")
    p.add_argument(
        "--target",
        default=None,
        help="smollm2_135m | tiny | an HF hub id or folder (default: the drafter's own target)",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument(
        "--gate",
        choices=[
            "default",
            "none",
            "entropy",
            "learned",
            "budget",
            "hybrid",
            "budget+entropy",
            "budget+learned",
            "hybrid+entropy",
            "hybrid+learned",
        ],
        default="default",
        help="head drafters: the drafter's default gate (config.json), none, entropy or learned;"
        " any drafter: budget (a tree built and sized each step on this machine's step cost) or"
        " hybrid (the same with n-gram candidates from the context); head drafters: "
        "budget+entropy etc., the budget with the gate's prediction as input",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="with a budget or hybrid gate: verify this many candidates every step (the tree"
        " still shaped per step by confidence) instead of sizing it per step by cost",
    )
    p.add_argument(
        "--tree", default=None, help="override the exported tree: preset, chain<K>, JSON paths"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="target dtype (default: float32 on the CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    args = p.parse_args(argv)
    if args.nodes is not None and args.gate not in BUDGET_GATES:
        p.error(f"--nodes sizes a dynamic tree: give --gate budget or hybrid (got {args.gate})")
    dynamic = DynamicConfig.fixed(args.nodes) if args.nodes is not None else None
    if args.threads:
        torch.set_num_threads(args.threads)

    identity = read_config(args.drafter)["target"]
    target = load_target(args.target, identity, args.dtype, args.device)
    drafter = load_drafter(args.drafter, target)
    ids = render_prompt(target.tokenizer, [{"role": "user", "content": args.prompt}])
    input_ids = torch.tensor([ids], device=target.device)
    tree = parse_tree(args.tree)
    streamer, stream = None, None
    if args.stream:
        from transformers import TextStreamer

        streamer = TextStreamer(target.tokenizer, skip_special_tokens=True)

        def stream(tokens: list[int]) -> None:
            streamer.put(torch.tensor(tokens))

    res = speculative_decode(
        target, drafter, input_ids, args.max_new_tokens, args.gate, tree, stream=stream,
        dynamic=dynamic,
    )  # fmt: skip
    if streamer is not None:
        streamer.end()
    else:
        print(target.tokenizer.decode(res.output_ids, skip_special_tokens=True), flush=True)
    s = res.stats()
    print(
        f"\n[{drafter.kind} {drafter.name}, gate {args.gate}, target {target.name}] "
        f"tau {s['tau']:.2f} (bonus included)  alpha {s['alpha']:.2f}  "
        f"tokens/s {s['new_tokens'] / s['wall_time_s']:.1f}  "
        f"({s['new_tokens']} tokens, {s['verify_forwards']} verification forwards: "
        f"{s['tree_steps']} tree, {s['ar_steps']} AR; {s['wall_time_s']:.2f} s)"
    )
    return 0


# ---- drafters-bench ------------------------------------------------------------------------------


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

    p = argparse.ArgumentParser(
        prog="drafters-bench",
        description=eval_bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bench", choices=["mt_bench", "spec_bench"], default="mt_bench")
    p.add_argument(
        "--eval-dir",
        default=str(eval_bench.EVAL_DIR),
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
        choices=eval_bench.BUILTIN_METHODS,
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
        choices=eval_bench.GATE_CHOICES,
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


# ---- drafters-tune -------------------------------------------------------------------------------


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


# ---- entry points --------------------------------------------------------------------------------


def bench_vllm_main(argv: list[str] | None = None) -> int:
    from drafters.eval.vllm_bench import main

    return main(argv)


COMMANDS: dict[str, Callable[[list[str] | None], int]] = {
    "export": export_main,
    "generate": generate_main,
    "bench": bench_main,
    "tune": tune_main,
    "bench-vllm": bench_vllm_main,
}


def export() -> None:
    sys.exit(run(export_main))


def generate() -> None:
    sys.exit(run(generate_main))


def bench() -> None:
    sys.exit(run(bench_main))


def tune() -> None:
    sys.exit(run(tune_main))


def bench_vllm() -> None:
    sys.exit(run(bench_vllm_main))


def main(argv: list[str] | None = None) -> int:
    """`python -m drafters.cli COMMAND ARGS`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m drafters.cli {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return run(COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
