"""drafters-generate: answer one prompt with speculative decoding and an exported drafter."""

from __future__ import annotations

import argparse

import torch

from drafters.cli.common import parse_tree

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
