"""What every console script shares: a bad input said in one line, and the --tree syntax."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable


class UsageError(ValueError):
    """A bad command line or input file, said in one line the user can act on."""


def user_errors() -> tuple[type[BaseException], ...]:
    """What a bad input raises, as opposed to a bug (which keeps its traceback)."""
    from safetensors import SafetensorError

    from drafters.target import TargetError

    return (ValueError, OSError, TargetError, SafetensorError)


def parse_tree(spec: str | None):
    """--tree: a JSON list of paths, or a name / file the tree resolvers accept as is."""
    if spec is not None and spec.lstrip().startswith("["):
        try:
            return json.loads(spec)
        except json.JSONDecodeError as e:
            raise UsageError(f"--tree {spec!r} is not a JSON list of paths: {e}") from None
    return spec


def run(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run one command; a user error prints `error: ...` and returns 1 (DRAFTERS_TRACEBACK=1
    re-raises it)."""
    try:
        return main(argv)
    except user_errors() as e:
        if os.environ.get("DRAFTERS_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
