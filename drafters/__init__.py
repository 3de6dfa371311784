"""drafters: train, export and benchmark speculative-decoding drafters.

The public API, for use beside a target outside this repository:

    from drafters import load_target, load_drafter, speculative_decode
    target = load_target("smollm2_135m")            # or an HF hub id / folder
    drafter = load_drafter("outputs/falcon_smollm2", target)
    result = speculative_decode(target, drafter, input_ids, max_new_tokens=256)
    result.output_ids, result.stats()               # equal to plain greedy; tau, alpha, ...

The package, in the order data flows: target.py -> data/ -> models/, losses/ -> training/ ->
export/ -> decoding/, speculate.py -> eval/; cli/ holds the console scripts, a module each.
"""

__version__ = "0.1.0"

_LAZY = {
    "load_target": "drafters.target",
    "Target": "drafters.target",
    "load_drafter": "drafters.export",
    "LoadedDrafter": "drafters.export",
    "export_checkpoint": "drafters.export",
    "speculative_decode": "drafters.speculate",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    # Lazy, so `import drafters` stays cheap and never pulls torch, Lightning or Hydra.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'drafters' has no attribute {name!r}")
