"""drafters-export: a training checkpoint (or an exported drafter) -> a drafter folder, ours or
an engine's (vLLM, vllm speculators)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from drafters.cli.common import parse_tree

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
