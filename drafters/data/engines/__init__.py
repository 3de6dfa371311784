"""Generation engines for self-distillation: one interface, three backends.

An engine takes a list of requests (prompt token ids) and generates each one's answer, greedy
or sampled, stopping at the target's end-of-turn token(s) or after `max_new_tokens`. When a
request finishes, the engine calls `on_done(request, ids, finish)`; the caller may return
follow-up requests (the conversation's next turn, whose prompt holds this answer), which join
the same run. `run` returns when no request is left.

    hf         HF `generate`, one padded batch at a time (the reference path)
    hf_fast    an in-place KV cache of `batch_size` slots; a finished row's slot is refilled
               at once from the queue (no decoding to the longest row, no cache re-copies)
    vllm       a vLLM engine in a child process (its own Python environment)

Every backend is deterministic given its requests: the same shard gives the same answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

BACKENDS = ("hf", "hf_fast", "vllm")


@dataclass
class Request:
    id: str
    prompt: list[int]
    seed: int = 0  # sampling only: each request draws from its own seeded generator
    payload: object = field(default=None, repr=False, compare=False)  # the caller's state


OnDone = Callable[[Request, list[int], str], list[Request]]


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    do_sample: bool = False
    temperature: float = 0.7
    top_p: float = 1.0


class Engine:
    """Base: `info` says what generated a corpus (recorded in its metadata)."""

    info: dict

    def run(self, requests: list[Request], sampling: SamplingConfig, on_done: OnDone) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def hf_engine_info(name: str, target) -> dict:
    """What generated a corpus, for the HF engines: engine, transformers version, dtype."""
    import transformers

    return {
        "engine": name,
        "version": transformers.__version__,
        "dtype": str(target.dtype).removeprefix("torch."),
    }


def make_engine(
    backend: str, target, batch_size: int, max_len: int, vllm_cfg=None, log_path=None
) -> Engine:
    """The engine named by `generation.backend`, for `target`, `batch_size` rows at a time,
    sequences up to `max_len` tokens (longest prompt + max_new_tokens); `log_path`: where the
    vLLM child writes its log."""
    if backend == "hf":
        from drafters.data.engines.hf import HFGenerateEngine

        return HFGenerateEngine(target, batch_size)
    if backend == "hf_fast":
        from drafters.data.engines.hf_fast import SlotEngine

        return SlotEngine(target, batch_size, max_len)
    if backend == "vllm":
        from drafters.data.engines.vllm_client import VLLMEngine

        return VLLMEngine(target, batch_size, max_len, vllm_cfg or {}, log_path=log_path)
    raise ValueError(f"generation.backend={backend!r}: use one of {', '.join(BACKENDS)}")
