"""Export: a training checkpoint becomes a self-contained drafter folder, and that folder loads
beside its target without Lightning or Hydra.

    format.py           the folder's format (config.json + model.safetensors) and its loader
    from_checkpoint.py  Lightning checkpoint -> drafter folder (validated, atomic)
"""

from drafters.export.format import (
    DTYPES,
    DrafterMismatchError,
    ExportError,
    LoadedDrafter,
    load_drafter,
    read_config,
)
from drafters.export.from_checkpoint import export_checkpoint, read_checkpoint, resolve_tree

__all__ = [
    "DTYPES",
    "DrafterMismatchError",
    "ExportError",
    "LoadedDrafter",
    "export_checkpoint",
    "load_drafter",
    "read_checkpoint",
    "read_config",
    "resolve_tree",
]
