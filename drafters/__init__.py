"""drafters: train, export and benchmark speculative-decoding drafters."""

__version__ = "0.1.0"

_LAZY = {
    "load_drafter": "drafters.drafter_io",
    "LoadedDrafter": "drafters.drafter_io",
    "export_checkpoint": "drafters.export",
    "speculative_decode": "drafters.speculate",
}


def __getattr__(name: str):
    # Lazy, so `import drafters` stays cheap and never pulls torch, Lightning or Hydra.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'drafters' has no attribute {name!r}")
