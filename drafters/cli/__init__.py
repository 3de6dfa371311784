"""The console scripts (`[project.scripts]` in pyproject.toml), one module each:

    drafters-export      a training checkpoint -> an exported drafter folder      (export.py)
    drafters-generate    answer one prompt with speculative decoding; print tau  (generate.py)
    drafters-bench       the Spec-Bench style benchmark                          (bench.py)
    drafters-bench-vllm  the same prompts through vLLM                           (bench.py)
    drafters-tune        the decoder's knobs on held-out ShareGPT                (tune.py)

`python -m drafters.cli COMMAND ARGS` runs the same (COMMAND: export, generate, bench, tune,
bench-vllm). A bad input (a missing or corrupt file, a drafter of another target, a malformed
prompt file, a bad option value) prints one `error: ...` line and exits 1; DRAFTERS_TRACEBACK=1
shows the traceback (common.py). `train.py` and `data/*.py` are the Hydra entry points; these
are the rest.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from drafters.cli.bench import bench_args, bench_main, bench_vllm_main
from drafters.cli.common import UsageError, parse_tree, run, user_errors
from drafters.cli.export import export_main
from drafters.cli.generate import generate_main
from drafters.cli.tune import tune_args, tune_main

__all__ = [
    "COMMANDS", "UsageError", "bench", "bench_args", "bench_main", "bench_vllm", "bench_vllm_main",
    "export", "export_main", "generate", "generate_main", "main", "parse_tree", "run", "tune",
    "tune_args", "tune_main", "user_errors",
]  # fmt: skip

COMMANDS: dict[str, Callable[[list[str] | None], int]] = {
    "export": export_main,
    "generate": generate_main,
    "bench": bench_main,
    "tune": tune_main,
    "bench-vllm": bench_vllm_main,
}


def export() -> None:
    sys.exit(run(export_main))


def generate() -> None:
    sys.exit(run(generate_main))


def bench() -> None:
    sys.exit(run(bench_main))


def tune() -> None:
    sys.exit(run(tune_main))


def bench_vllm() -> None:
    sys.exit(run(bench_vllm_main))


def main(argv: list[str] | None = None) -> int:
    """`python -m drafters.cli COMMAND ARGS`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m drafters.cli {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return run(COMMANDS[argv[0]], argv[1:])
