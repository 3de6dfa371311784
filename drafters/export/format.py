"""The exported drafter format: a folder of config.json + model.safetensors, and its loader.

    config.json         what to build and how to use it (schema below), written last
    model.safetensors   the drafter's weights (and the learned gate's), nothing of the target's

config.json (format_version 1):

    format            "drafters.drafter"
    format_version    1
    kind              "medusa" | "cerberus" | "falcon"
    model             the drafter's full config (the dataclass fields of MedusaConfig, ...)
    target            identity of the target it was trained on: name, architecture, tokenizer_hash,
                      weights_hash (`TargetIdentity`); a target that differs is refused (a
                      drafter exported before weights_hash: on the fields it has and the name)
    tree              {"name": preset name or null, "spec": list of paths}: ranks per depth, per
                      head for head drafters (`drafters.decoding.tree`), per drafter block of k
                      depths for Falcon (`drafters.decoding.falcon_tree`); written out in full,
                      so a changed preset never changes an exported drafter
    gate              {"default": "learned" | "entropy" | null   (what decoders use unless told),
                       "trained": the checkpoint's `gate` hyper-parameter,
                       "entropy": {"num_heads", "edges", "values", "fitted"} or null,
                       "learned": {"hidden_size", "num_heads", "hidden_dim"} or null}
    weights           {"file", "dtype", "sha256", "num_params", "tensors": {name: shape}}
    source            {"checkpoint", "global_step", "epoch", "drafters_version"} (optional)

Weight names keep the checkpoint's prefixes: `drafter.*` and, with a learned gate, `gate.*`. The
entropy gate is a calibration table, stored in config.json (readable, float32-exact). Loading
needs torch and safetensors only: no Lightning, no Hydra. A folder without config.json (an
interrupted export), with unknown keys, another format version, or weights that do not match
their checksum or their config is refused, with the file and the problem named.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drafters.models import (
    DRAFTERS,
    HEAD_KINDS,
    EntropyGate,
    LearnedGate,
    LearnedGateConfig,
    build_drafter,
)
from drafters.target import Target

FORMAT = "drafters.drafter"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
GATES = ("entropy", "learned")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Default trees, as the papers: Medusa's 63-node tree (cut to the drafter's number of heads) for
# head drafters, Falcon's released 165-node tree. Small targets on a CPU: export with a smaller
# one (`--tree mc_sim_7b_63_first16`, `--tree falcon_k2_32`).
DEFAULT_HEAD_TREE = "mc_sim_7b_63"
DEFAULT_FALCON_TREE = "kmask2_8layer_tree"
CONFIG_KEYS = {"format", "format_version", "kind", "model", "target", "tree", "gate", "weights"}
CONFIG_KEYS_OPTIONAL = {"source"}


class ExportError(ValueError):
    """A checkpoint or exported folder cannot be used; the message names the file and why."""


class DrafterMismatchError(ValueError):
    """The drafter was trained for another target (the message names both)."""


# ---- the loaded drafter ---------------------------------------------------------------------


@dataclass
class LoadedDrafter:
    """An exported drafter, ready for `drafters.speculate.speculative_decode`.

    kind: "medusa" | "cerberus" | "falcon".  model: the drafter nn.Module, eval mode, no grads.
    gate: the default gate (config.json gate.default) or None; gates: every gate available by
    name ("entropy", "learned"). tree: a `Tree` (both kinds; a Falcon tree is read in blocks
    of k depths by `decode_falcon`). config: config.json as a dict. folder: where it came from.
    """

    kind: str
    model: nn.Module
    gate: nn.Module | None
    gates: dict[str, nn.Module] = field(default_factory=dict)
    tree: Any = None
    config: dict = field(default_factory=dict)
    folder: Path | None = None

    @property
    def name(self) -> str:
        return self.folder.name if self.folder is not None else self.kind

    @property
    def target_identity(self) -> dict:
        return self.config["target"]

    def get_gate(self, name: str | None) -> nn.Module | None:
        """A gate by name: "default" (config.json's), "none"/None, "entropy" or "learned"."""
        if name == "default":
            return self.gate
        if name in (None, "none"):
            return None
        if name not in GATES:
            raise ValueError(f"gate {name!r}: use default, none, entropy or learned")
        if name not in self.gates:
            have = sorted(self.gates) or ["none"]
            raise ValueError(
                f"drafter {self.name!r} ({self.kind}) has no {name} gate; it has: {', '.join(have)}"
            )
        return self.gates[name]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        for m in [self.model, *self.gates.values()]:
            if isinstance(m, EntropyGate):
                m.to(device)  # its table stays float32
            else:
                m.to(device=device, dtype=dtype)
        return self

    def check_target(self, target: Target) -> None:
        problem = target.identity.mismatch(self.target_identity, f"drafter {self.folder}")
        if problem:
            raise DrafterMismatchError(problem)


# ---- shared with export -----------------------------------------------------------------------


def load_state_strict(module: nn.Module, state: dict[str, torch.Tensor], what: str, where) -> None:
    """load_state_dict with a message that lists every missing, unexpected or misshapen key."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if tuple(state[k].shape) != tuple(own[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    if shapes:
        problems.append("shape mismatch " + "; ".join(shapes))
    if problems:
        raise ExportError(
            f"{where}: the {what} weights do not fit its config: " + ", ".join(problems)
        )
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


def build_model(kind: str, model_cfg: dict, where) -> nn.Module:
    try:
        return build_drafter(kind, dict(model_cfg))
    except (TypeError, ValueError) as e:
        raise ExportError(f"{where}: bad {kind} config: {e}") from e


def _entropy_gate_from(table: dict) -> EntropyGate:
    gate = EntropyGate(num_heads=int(table["num_heads"]), num_bins=len(table["values"]))
    gate.edges.copy_(torch.tensor(table["edges"], dtype=torch.float32))
    gate.values.copy_(torch.tensor(table["values"], dtype=torch.float32))
    gate.fitted.fill_(bool(table["fitted"]))
    return gate


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---- load -----------------------------------------------------------------------------------


def read_config(folder: str | Path) -> dict:
    """config.json of an exported drafter, validated (no weights read)."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not folder.is_dir():
        raise FileNotFoundError(f"drafter folder {folder} does not exist")
    if not path.is_file():
        raise ExportError(
            f"{folder}: no {CONFIG_FILE}: not an exported drafter, or an interrupted export "
            "(export again with `drafters-export`)"
        )
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f"{path}: not a drafters drafter config (format != {FORMAT!r})")
    version = config.get("format_version")
    if version != FORMAT_VERSION:
        raise ExportError(
            f"{path}: format_version {version!r}; this drafters reads version {FORMAT_VERSION}"
        )
    missing = sorted(CONFIG_KEYS - set(config))
    unknown = sorted(set(config) - CONFIG_KEYS - CONFIG_KEYS_OPTIONAL)
    if missing or unknown:
        raise ExportError(f"{path}: missing keys {missing}, unknown keys {unknown}")
    if config["kind"] not in DRAFTERS:
        raise ExportError(f"{path}: unknown drafter kind {config['kind']!r}")
    w = config["weights"]
    if not isinstance(w, dict) or w.get("dtype") not in DTYPES or not w.get("sha256"):
        raise ExportError(f"{path}: weights entry needs file, dtype ({sorted(DTYPES)}), sha256")
    return config


def load_drafter(
    folder: str | Path,
    target: Target | None = None,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> LoadedDrafter:
    """An exported drafter. With `target`, the target's identity is checked (a different
    tokenizer, hidden size or vocabulary is refused, naming both) and the drafter moves to the
    target's device and dtype (unless `device` / `dtype` say otherwise)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_config(folder)
    kind = config["kind"]
    loaded = LoadedDrafter(kind, build_model(kind, config["model"], folder / CONFIG_FILE), None)
    loaded.config, loaded.folder = config, folder
    if target is not None:
        loaded.check_target(target)

    wpath = folder / config["weights"]["file"]
    if not wpath.is_file():
        raise ExportError(f"{folder}: weights file {wpath.name} is missing")
    if sha256_file(wpath) != config["weights"]["sha256"]:
        raise ExportError(f"{wpath}: checksum differs from config.json: truncated or replaced?")
    try:
        tensors = load_file(str(wpath))
    except (SafetensorError, OSError) as e:
        raise ExportError(f"{wpath}: cannot read the weights ({e})") from e
    groups: dict[str, dict] = {"drafter": {}, "gate": {}}
    for name, t in tensors.items():
        prefix, _, rest = name.partition(".")
        if prefix not in groups:
            raise ExportError(f"{wpath}: unexpected tensor {name!r}")
        groups[prefix][rest] = t
    load_state_strict(loaded.model, groups["drafter"], "drafter", wpath)

    try:
        _attach_gates_and_tree(loaded, groups["gate"], wpath)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ExportError):
            raise
        raise ExportError(f"{folder / CONFIG_FILE}: bad gate or tree entry ({e!r})") from e

    for m in [loaded.model, *loaded.gates.values()]:
        m.eval().requires_grad_(False)
    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    if target is not None:
        device = device if device is not None else target.device
        dtype = dtype if dtype is not None else target.dtype
    loaded.to(device, dtype if dtype is not None else DTYPES[config["weights"]["dtype"]])
    return loaded


def _attach_gates_and_tree(loaded: LoadedDrafter, gate_state: dict, wpath: Path) -> None:
    from drafters.decoding.falcon_tree import get_falcon_tree
    from drafters.decoding.tree import get_tree

    config, where = loaded.config, loaded.folder / CONFIG_FILE
    g = config["gate"]
    if g.get("entropy") is not None:
        loaded.gates["entropy"] = _entropy_gate_from(g["entropy"])
    if g.get("learned") is not None:
        lg = LearnedGate(LearnedGateConfig(**g["learned"]))
        load_state_strict(lg, gate_state, "learned gate", wpath)
        loaded.gates["learned"] = lg
    elif gate_state:
        raise ExportError(f"{wpath}: gate.* weights but no learned gate in config.json")
    default = g.get("default")
    if default is not None and default not in loaded.gates:
        raise ExportError(f"{where}: default gate {default!r} is not stored")
    loaded.gate = loaded.gates.get(default) if default else None

    spec = config["tree"].get("spec")
    if loaded.kind in HEAD_KINDS:
        loaded.tree = get_tree(spec if spec is not None else DEFAULT_HEAD_TREE)
        if loaded.tree.depth > loaded.model.num_heads:
            raise ExportError(
                f"{where}: tree depth {loaded.tree.depth} > {loaded.model.num_heads} heads"
            )
    else:
        loaded.tree = spec if spec is not None else config["tree"].get("name")
        if loaded.tree is not None:
            loaded.tree = get_falcon_tree(loaded.tree, loaded.model.cfg.k)
