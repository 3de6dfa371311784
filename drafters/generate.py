"""Answer one prompt with speculative decoding and an exported drafter; print tau, alpha, tok/s.

    python -m drafters.generate --drafter exported/cerberus_smollm2 --prompt "Why is the sky blue?"
    python -m drafters.generate --drafter DIR --prompt "..." --gate none --tree chain4

The target defaults to the one the drafter was trained for (its exported identity): the embedded
SmolLM2 for `HuggingFaceTB/SmolLM2-135M-Instruct`, else that name as an HF hub id or folder. The
prompt is rendered with the target's chat template as one user turn. The answer is printed once
decoding ends (the decoders have no streaming hook yet), then the statistics:
tau = new tokens per target verification forward, bonus token included (plain AR: 1);
alpha = accepted draft tokens / new tokens; tokens/s over prefill + decoding.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def parse_tree(spec: str | None):
    if spec is not None and spec.lstrip().startswith("["):
        return json.loads(spec)
    return spec


def main(argv: list[str] | None = None) -> int:
    from drafters.data.chat import render_prompt
    from drafters.drafter_io import DrafterMismatchError, ExportError, load_drafter, read_config
    from drafters.speculate import speculative_decode
    from drafters.target import load_target

    p = argparse.ArgumentParser(
        prog="python -m drafters.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--drafter", required=True, help="an exported drafter folder (export.py)")
    p.add_argument("--prompt", required=True, help="the user message")
    p.add_argument(
        "--target",
        default=None,
        help="smollm2_135m | tiny | an HF hub id or folder (default: the drafter's own target)",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument(
        "--gate",
        choices=["default", "none", "entropy", "learned"],
        default="default",
        help="head drafters: the drafter's default gate (config.json), none, entropy or learned",
    )
    p.add_argument(
        "--tree", default=None, help="override the exported tree: preset, chain<K>, JSON paths"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="target dtype (default: float32 on the CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    try:
        identity = read_config(args.drafter)["target"]
        target = load_target(args.target, identity, args.dtype, args.device)
        drafter = load_drafter(args.drafter, target)
    except (ExportError, DrafterMismatchError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    ids = render_prompt(target.tokenizer, [{"role": "user", "content": args.prompt}])
    input_ids = torch.tensor([ids], device=target.device)
    try:
        res = speculative_decode(
            target, drafter, input_ids, args.max_new_tokens, args.gate, parse_tree(args.tree)
        )
    except (ValueError, NotImplementedError) as e:  # no such gate / tree, no Falcon decoder
        print(f"error: {e}", file=sys.stderr)
        return 1
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


if __name__ == "__main__":
    sys.exit(main())
