"""What a drafter, a feature cache or a distilled corpus must agree on with its target: the
target's identity (name, architecture, tokenizer hash, a fingerprint of its weights), and how
the fingerprint is read, from loaded parameters or from the checkpoint files alone (meta
device). `drafters.target` builds targets; this module only identifies them."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn


class TargetError(RuntimeError):
    """A target cannot be loaded as configured; the message says which setting to change."""


@dataclass(frozen=True)
class TargetIdentity:
    """What a drafter, a feature cache or a distilled dataset must agree on with its target.

    The architecture (model_type, hidden_size, vocab_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, intermediate_size), the tokenizer
    (`tokenizer_hash`) and the weights (`weights_hash`, see `weights_fingerprint`): two targets
    agree iff they are the same model, whatever dtype or device each was loaded in. Llama-2-chat
    and Llama-2 base share every field but `weights_hash`.

    Compatibility rule (`mismatch`): a stored identity is compared on the keys it holds.
    One written by older code ({name, hidden_size, vocab_size, tokenizer_hash}, no
    `weights_hash`) is accepted iff those fields agree *and* the name is the same: without a
    fingerprint the name is the only evidence of which weights made it. With a fingerprint on
    both sides the fingerprint decides and the name is a label: the same weights loaded from a
    hub id and from a local copy agree. The message names both targets and every differing field.
    """

    name: str
    model_type: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tokenizer_hash: str
    weights_hash: str

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def is_identity(d) -> bool:
        """True if `d` is an identity dict, of this format or an older one (a subset of keys)."""
        fields = set(TargetIdentity.__dataclass_fields__)
        return isinstance(d, dict) and bool(d) and set(d) <= fields and set(LEGACY_KEYS) <= set(d)

    def mismatch(self, other: dict | TargetIdentity, what: str) -> str | None:
        """A human message if `other` (stored with `what`) was made for another target."""
        other = other if isinstance(other, dict) else other.to_dict()
        mine = self.to_dict()
        keys = [k for k in mine if k != "name" and k in other]
        if "weights_hash" not in other:
            keys.insert(0, "name")  # an older identity: the name stands in for the weights
        diffs = [
            f"{k}: {what} has {other.get(k)!r}, the loaded target has {mine[k]!r}"
            for k in keys
            if other.get(k) != mine[k]
        ]
        if not diffs:
            return None
        return (
            f"{what} was made for target {other.get('name')!r}, not for the loaded target "
            f"{self.name!r}:\n  " + "\n  ".join(diffs)
        )


# The identity fields written before the architecture and the weights fingerprint were added.
LEGACY_KEYS = ("name", "hidden_size", "vocab_size", "tokenizer_hash")

# Elements hashed at each end of every fingerprinted tensor (the whole tensor if it is shorter).
FINGERPRINT_EDGE = 4096


def _fingerprinted(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The fixed tensors of the weights fingerprint, each with a structural tag: the input
    embedding, every parameter of the first and the last decoder layer (a fine-tune that leaves
    the embeddings alone, e.g. a merged LoRA, still changes them), the final norm, the LM head."""
    base = model.base_model
    picks = [("embed", model.get_input_embeddings().weight)]
    layers = getattr(base, "layers", None)
    if layers is not None and len(layers):
        for tag, layer in (("first_layer", layers[0]), ("last_layer", layers[-1])):
            picks += [(f"{tag}.{n}", p) for n, p in sorted(layer.named_parameters())]
    norm = getattr(base, "norm", None)
    if isinstance(getattr(norm, "weight", None), torch.Tensor):
        picks.append(("norm", norm.weight))
    picks.append(("lm_head", model.get_output_embeddings().weight))
    return picks


def _edges_of(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    n = FINGERPRINT_EDGE
    parts = [flat] if flat.numel() <= 2 * n else [flat[:n], flat[-n:]]
    return torch.cat([x.to("cpu").to(torch.bfloat16) for x in parts])


def _edges_of_slice(sl) -> tuple[list[int], torch.Tensor]:
    """`_edges_of` for a safetensors slice, reading only the rows that hold the edges."""
    shape = list(sl.get_shape())
    numel = math.prod(shape)
    n = FINGERPRINT_EDGE
    if not shape or numel <= 2 * n:
        flat = sl[:].reshape(-1)
        return shape, flat.to(torch.bfloat16)
    r = -(-n // max(1, numel // shape[0]))  # rows holding the first / last n elements
    head = sl[:r].reshape(-1)[:n]
    tail = sl[shape[0] - r :].reshape(-1)[-n:]
    return shape, torch.cat([head, tail]).to(torch.bfloat16)


def _digest(items) -> str:
    h = hashlib.sha256()
    for tag, shape, data in items:
        h.update(f"{tag}:{list(shape)}:".encode())
        h.update(data.contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def weights_fingerprint(model: nn.Module, path: str | None = None) -> str:
    """sha256 over the first and last `FINGERPRINT_EDGE` elements of a few fixed tensors
    (`_fingerprinted`), cast to bfloat16 (round-to-nearest-even: a float32 and a bfloat16 load
    of the same weights agree). Reads a few hundred KB whatever the model's size.

    From the parameters when they hold the weights; from the checkpoint files at `path`
    (safetensors slices, else memory-mapped .bin) when they do not (a `device="meta"` target,
    quantized parameters). Both give the same fingerprint for the same weights.
    """
    picks = _fingerprinted(model)
    if all(p.is_floating_point() and p.device.type != "meta" for _, p in picks):
        return _digest((tag, p.shape, _edges_of(p)) for tag, p in picks)
    if path is None:
        raise TargetError("the target's weights are not loaded and it has no folder to read")
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    prefix = f"{model.base_model_prefix}."
    folder = _weights_folder(path)
    with _CheckpointReader(folder) as reader:
        items = []
        for tag, p in picks:
            candidates = names.get(id(p), [])
            candidates = candidates + [c.removeprefix(prefix) for c in candidates]
            found = next((c for c in candidates if c in reader), None)
            if found is None:
                raise TargetError(
                    f"{folder}: no tensor {candidates[0] if candidates else tag!r} in the "
                    "checkpoint files; cannot fingerprint the target's weights"
                )
            items.append((tag, *reader.edges(found)))
        return _digest(items)


def _weights_folder(path: str) -> Path:
    """The local folder of a target's checkpoint: `path` itself, or its hub snapshot with the
    checkpoint files fetched into the HF cache if needed (the safetensors shards of its index,
    else the .bin ones: the files vLLM loads from there anyway)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    try:
        import huggingface_hub as hub
        from huggingface_hub import errors

        absent = getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError)
        for index, single in (
            ("model.safetensors.index.json", "model.safetensors"),
            ("pytorch_model.bin.index.json", "pytorch_model.bin"),
        ):
            try:
                got = Path(hub.hf_hub_download(path, index))
            except absent:
                try:
                    return Path(hub.hf_hub_download(path, single)).parent
                except absent:
                    continue
            files = sorted(set(json.loads(got.read_text())["weight_map"].values()))
            hub.snapshot_download(path, allow_patterns=files)
            return got.parent
    except Exception as e:  # offline, gated, unknown id
        raise TargetError(
            f"cannot read the weights of {path!r} to fingerprint them ({e}); download them "
            "first or set target.name_or_path to a local folder"
        ) from e
    raise TargetError(f"{path!r} has no safetensors or .bin checkpoint to fingerprint")


class _CheckpointReader:
    """Tensor lookup across the checkpoint files of a folder, reading only what is asked."""

    def __init__(self, folder: Path):
        from contextlib import ExitStack

        self._stack = ExitStack()
        self._where: dict[str, object] = {}
        self._bin: dict[str, torch.Tensor] = {}
        files = sorted(folder.glob("*.safetensors"))
        if files:
            from safetensors import safe_open

            for f in files:
                handle = self._stack.enter_context(safe_open(str(f), framework="pt"))
                for k in handle.keys():
                    self._where[k] = handle
        else:
            for f in sorted(folder.glob("*.bin")):
                try:  # memory-mapped: only the slices read below leave the disk
                    sd = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
                except Exception:  # not a state dict (training_args.bin, ...)
                    continue
                if isinstance(sd, dict):
                    self._bin.update({k: v for k, v in sd.items() if torch.is_tensor(v)})
        if not self._where and not self._bin:
            raise TargetError(f"{folder}: no *.safetensors or *.bin checkpoint files")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def __contains__(self, name: str) -> bool:
        return name in self._where or name in self._bin

    def edges(self, name: str) -> tuple[list[int], torch.Tensor]:
        if name in self._where:
            return _edges_of_slice(self._where[name].get_slice(name))
        t = self._bin[name]
        return list(t.shape), _edges_of(t)


def tokenizer_hash(tokenizer) -> str:
    """sha256 over the vocabulary and special tokens: equal iff token ids mean the same text."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    specials = {
        "bos": tokenizer.bos_token,
        "eos": tokenizer.eos_token,
        "pad": tokenizer.pad_token,
        "unk": tokenizer.unk_token,
    }
    h.update(json.dumps(specials, sort_keys=True).encode())
    return h.hexdigest()[:16]
