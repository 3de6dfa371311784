"""Export a trained drafter (Lightning checkpoint) to a self-contained folder (`format.py`).

    export_checkpoint("logs/train/cerberus_smollm2/checkpoints/last.ckpt", "exported/cerberus")

The checkpoint is read with `torch.load(weights_only=True)` and validated (its keys, its kind, its
config, every weight's name and shape); any problem raises ExportError naming the file. The
folder is written atomically: filled under a hidden temporary name beside its destination,
config.json last (with the weights' sha256), checked by loading it back, then renamed into place.
An interrupted export leaves no folder at the destination, and its temporary folder (left only
by a hard kill) has no config.json, so it does not load.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from drafters.export.format import (
    CONFIG_FILE,
    DEFAULT_FALCON_TREE,
    DEFAULT_HEAD_TREE,
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    GATES,
    WEIGHTS_FILE,
    ExportError,
    build_model,
    load_drafter,
    load_state_strict,
    sha256_file,
)
from drafters.io_utils import staged_dir
from drafters.models import DRAFTERS, HEAD_KINDS, EntropyGate, LearnedGate, LearnedGateConfig
from drafters.target_identity import TargetIdentity

# ---- reading a Lightning checkpoint ---------------------------------------------------------


def read_checkpoint(path: str | Path) -> dict:
    """The parts of a DrafterLitModule checkpoint an export needs, validated.

    Returns {"hparams", "drafter" (state dict without prefix), "gate", "entropy_gate",
    "global_step", "epoch"}. Any problem raises ExportError naming the file.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        ckpt = read_deepspeed_checkpoint(path)
    elif not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    else:
        ckpt = _load_file(path)
    return _validate(ckpt, path)


def read_deepspeed_checkpoint(folder: Path) -> dict:
    """The Lightning checkpoint inside a DeepSpeed checkpoint folder (what Lightning's
    DeepSpeedStrategy writes instead of a file: `latest`, `checkpoint/` with the ZeRO shards),
    its ZeRO-sharded weights gathered into one fp32 state_dict by Lightning's
    `convert_zero_checkpoint_to_fp32_state_dict`. DeepSpeed's shard files hold pickled Python
    objects, so they are unpickled (weights_only=False): export only folders you trust."""
    if not (folder / "latest").is_file():
        raise ExportError(
            f"{folder}: a folder, but not a DeepSpeed checkpoint (no `latest` file in it)"
        )
    try:
        from lightning.pytorch.utilities.deepspeed import (
            convert_zero_checkpoint_to_fp32_state_dict,
        )
    except ModuleNotFoundError as e:
        raise ExportError(
            f"{folder}: a DeepSpeed checkpoint; reading it needs deepspeed ({e})"
        ) from e
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # its progress lines
                return convert_zero_checkpoint_to_fp32_state_dict(folder, Path(tmp) / "fp32.ckpt")
        except ModuleNotFoundError as e:
            raise ExportError(
                f"{folder}: reading a DeepSpeed checkpoint needs deepspeed ({e})"
            ) from e
        except Exception as e:
            raise ExportError(
                f"{folder}: cannot convert the DeepSpeed checkpoint ({type(e).__name__}: "
                f"{str(e)[:300]})"
            ) from e


def _load_file(path: Path) -> dict:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, not a torch file, pickled objects, ...
        raise ExportError(
            f"{path}: cannot read the checkpoint ({type(e).__name__}: {str(e)[:300]}); "
            "is the file truncated or not a drafters training checkpoint?"
        ) from e
    return ckpt


def _validate(ckpt, path: Path) -> dict:
    if not isinstance(ckpt, dict):
        raise ExportError(f"{path}: not a Lightning checkpoint (a {type(ckpt).__name__})")
    missing = [k for k in ("hyper_parameters", "state_dict") if k not in ckpt]
    if missing:
        raise ExportError(
            f"{path}: not a drafters training checkpoint: missing {missing} "
            f"(has {sorted(ckpt)[:10]})"
        )
    hp, sd = ckpt["hyper_parameters"], ckpt["state_dict"]
    missing = [k for k in ("kind", "model", "target") if k not in hp]
    if missing:
        raise ExportError(f"{path}: hyper_parameters lack {missing}: not a DrafterLitModule?")
    kind = hp["kind"]
    if kind not in DRAFTERS:
        raise ExportError(
            f"{path}: unknown drafter kind {kind!r}; expected one of {sorted(DRAFTERS)}"
        )
    gate = hp.get("gate")
    if gate not in (None, *GATES):
        raise ExportError(f"{path}: unknown gate {gate!r}; expected null, entropy or learned")
    if gate is not None and kind not in HEAD_KINDS:
        raise ExportError(f"{path}: a {kind} drafter has no gate, but gate={gate!r}")
    if not TargetIdentity.is_identity(hp["target"]):
        raise ExportError(f"{path}: hyper_parameters.target is not a target identity")

    groups: dict[str, dict[str, torch.Tensor]] = {"drafter": {}, "gate": {}, "entropy_gate": {}}
    for name, tensor in sd.items():
        prefix, _, rest = name.partition(".")
        if prefix not in groups or not rest:
            raise ExportError(f"{path}: unexpected state_dict entry {name!r}")
        groups[prefix][rest] = tensor
    if not groups["drafter"]:
        raise ExportError(f"{path}: the state_dict holds no drafter.* weights")
    if gate == "learned" and not groups["gate"]:
        raise ExportError(f"{path}: gate='learned' but the state_dict has no gate.* weights")
    if kind in HEAD_KINDS and not groups["entropy_gate"]:
        raise ExportError(f"{path}: a {kind} checkpoint without its entropy_gate.* calibration")
    return {
        "hparams": hp,
        "drafter": groups["drafter"],
        "gate": groups["gate"],
        "entropy_gate": groups["entropy_gate"],
        "global_step": ckpt.get("global_step"),
        "epoch": ckpt.get("epoch"),
    }


# ---- trees ----------------------------------------------------------------------------------


def default_tree(kind: str, model_cfg: dict) -> dict:
    default = DEFAULT_HEAD_TREE if kind in HEAD_KINDS else DEFAULT_FALCON_TREE
    return resolve_tree(kind, model_cfg, default)


def resolve_tree(kind: str, model_cfg: dict, tree: Any) -> dict:
    """config.json's tree entry {"name", "spec": list of paths} from a spec: a preset name,
    `chain<D>` (Falcon also `chain`), a list of paths, a JSON file holding one of those, or a
    JSON file {"topk_acc": (D, k) per-depth top-k accuracies, "num_nodes": n} (tree built
    greedily: `build_tree`, Falcon `build_falcon_tree` with optional "max_anchors"). Head
    drafters: a preset's paths deeper than the number of heads are dropped (a prefix-closed
    subset stays a tree); a given tree deeper than that is refused."""
    from drafters.decoding.falcon_tree import build_falcon_tree, get_falcon_tree
    from drafters.decoding.tree import PRESETS, build_tree, get_tree

    name = tree if isinstance(tree, str) else None
    if isinstance(tree, str) and tree.endswith(".json") and Path(tree).is_file():
        name, tree = None, json.loads(Path(tree).read_text())
    if kind not in HEAD_KINDS:
        k = int(model_cfg.get("k", 2))
        if isinstance(tree, dict) and "topk_acc" in tree:
            t = build_falcon_tree(
                tree["topk_acc"], int(tree["num_nodes"]), k, tree.get("max_anchors")
            )
            return {"name": "built", "spec": t.to_list()}
        try:
            return {"name": name, "spec": get_falcon_tree(tree, k).to_list()}
        except ValueError as e:
            raise ExportError(f"Falcon tree {tree!r}: {e}") from e
    if isinstance(tree, dict) and "topk_acc" in tree:
        built = build_tree(tree["topk_acc"], int(tree.get("num_nodes", 63)))
        return {"name": "built", "spec": built.to_list()}
    k = int(model_cfg["num_heads"])
    if isinstance(tree, str) and tree in PRESETS:
        paths = [p for p in PRESETS[tree] if len(p) <= k]
        return {"name": tree if len(paths) == len(PRESETS[tree]) else f"{tree}_depth{k}",
                "spec": get_tree(paths).to_list()}  # fmt: skip
    try:
        t = get_tree(tree)
    except ValueError as e:
        raise ExportError(f"tree {tree!r}: {e}") from e
    if t.depth > k:
        raise ExportError(f"tree {name or 'given'} has depth {t.depth} > the drafter's {k} heads")
    return {"name": name, "spec": t.to_list()}


# ---- export ---------------------------------------------------------------------------------


def export_checkpoint(
    ckpt_path: str | Path,
    out_dir: str | Path,
    dtype: str = "float32",
    tree: Any = None,
    overwrite: bool = False,
) -> Path:
    """Write the drafter of a training checkpoint to `out_dir` (see the module docstring)."""
    from safetensors.torch import save_file

    from drafters import __version__

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {sorted(DTYPES)}")
    ckpt_path, out_dir = Path(ckpt_path), Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; pass overwrite=True (--force) to replace it")
    ck = read_checkpoint(ckpt_path)
    hp, kind = ck["hparams"], ck["hparams"]["kind"]
    drafter = build_model(kind, hp["model"], ckpt_path)
    load_state_strict(drafter, ck["drafter"], "drafter", ckpt_path)
    tensors = {f"drafter.{k}": v for k, v in drafter.state_dict().items()}

    gate_cfg: dict[str, Any] = {"default": hp.get("gate"), "trained": hp.get("gate")}
    gate_cfg["entropy"] = gate_cfg["learned"] = None
    if kind in HEAD_KINDS:
        eg = EntropyGate(num_heads=drafter.num_heads, num_bins=ck["entropy_gate"]["values"].numel())
        load_state_strict(eg, ck["entropy_gate"], "entropy gate", ckpt_path)
        gate_cfg["entropy"] = {
            "num_heads": eg.num_heads,
            "edges": eg.edges.tolist(),
            "values": eg.values.tolist(),
            "fitted": bool(eg.fitted),
        }
    if hp.get("gate") == "learned":
        lg_cfg = LearnedGateConfig(
            int(hp["model"]["hidden_size"]), drafter.num_heads, int(hp.get("gate_hidden_dim", 256))
        )
        lg = LearnedGate(lg_cfg)
        load_state_strict(lg, ck["gate"], "learned gate", ckpt_path)
        tensors.update({f"gate.{k}": v for k, v in lg.state_dict().items()})
        gate_cfg["learned"] = {
            "hidden_size": lg_cfg.hidden_size,
            "num_heads": lg_cfg.num_heads,
            "hidden_dim": lg_cfg.hidden_dim,
        }
    tree_cfg = (
        default_tree(kind, hp["model"]) if tree is None else resolve_tree(kind, hp["model"], tree)
    )

    dt = DTYPES[dtype]
    tensors = {
        k: (v.to(dt) if v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in tensors.items()
    }
    with staged_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        config = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": kind,
            "model": dict(hp["model"]),
            "target": dict(hp["target"]),
            "tree": tree_cfg,
            "gate": gate_cfg,
            "weights": {
                "file": WEIGHTS_FILE,
                "dtype": dtype,
                "sha256": sha256_file(tmp / WEIGHTS_FILE),
                # parameters only: not the draft vocabulary's ids (an int64 buffer)
                "num_params": sum(v.numel() for v in tensors.values() if v.is_floating_point()),
                "tensors": {k: list(v.shape) for k, v in tensors.items()},
            },
            "source": {
                "checkpoint": str(ckpt_path.resolve()),
                "global_step": ck["global_step"],
                "epoch": ck["epoch"],
                "drafters_version": __version__,
            },
        }
        _write_config(tmp / CONFIG_FILE, config)  # last: its presence marks a complete folder
        load_drafter(tmp)  # what was written loads, or the export fails here
    return out_dir


def _write_config(path: Path, config: dict) -> None:
    text = json.dumps(config, indent=1)
    # lists of numbers on one line (tree paths, calibration tables, shapes)
    text = re.sub(
        r"\[\s*([-+\d.eE,\s]*?)\s*\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
        text,
    )
    with open(path, "w") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())
