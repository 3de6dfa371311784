"""Export a training checkpoint to a drafter folder (config.json + model.safetensors).

    python export.py logs/train/cerberus_smollm2/checkpoints/last.ckpt drafters_out/cerberus_smollm2
    python export.py CKPT OUT --dtype bfloat16 --tree mc_sim_7b_63_first16 --force

The folder loads with `drafters.load_drafter(OUT, target)` (no Lightning, no Hydra) and runs with
`python -m drafters.generate --drafter OUT` and `python -m drafters.bench --drafter OUT`.
Format: the docstring of drafters/drafter_io.py.
"""

import argparse
import json
import sys

from drafters.export import DTYPES, ExportError, export_checkpoint


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkpoint", help="a Lightning checkpoint written by train.py (.ckpt)")
    p.add_argument("out", help="the drafter folder to write (atomically)")
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
    tree = args.tree
    if tree is not None and tree.lstrip().startswith("["):
        tree = json.loads(tree)
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.dtype, tree, args.force)
    except (ExportError, FileExistsError, FileNotFoundError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    config = json.loads((out / "config.json").read_text())
    tree = config["tree"]["name"] or config["tree"]["spec"] or "decoder default"
    print(
        f"exported {config['kind']} drafter ({config['weights']['num_params']:,} parameters, "
        f"{config['weights']['dtype']}, tree {tree}, "
        f"gate {config['gate']['default']}) for target {config['target']['name']} to {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
