"""What every decoder returns (`DecodeResult`) and the bookkeeping they share (`Generation`).

Counting (docs/design.md section 6): the prefill emits the first new token; every verification
forward (a tree step or a 1-token AR step; the prefill is not one) emits its accepted draft tokens
plus one bonus token, fewer only when EOS or max_new_tokens ends generation inside that step. So
    tau   = (new_tokens - 1) / verify_forwards   (bonus included; plain AR decoding has tau = 1)
    alpha = accepted draft tokens / new_tokens
Pool several prompts with the raw counts of `stats()`, not by averaging per-prompt ratios.

Phase. A verification forward starts from committed tokens t_0 .. t_N, t_N the root (emitted, not
yet in the target's cache): N = prompt length + tokens emitted before the step - 1, the root's
index in `sequences` (`step_positions`). A Falcon drafter works in blocks of k positions, so its
acceptance may depend on N mod k; `tau_by_phase(k)` splits tau by that phase, with counts that
pool across prompts like those of `stats()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise

import torch


def sync_clock(device: torch.device) -> float:
    """time.perf_counter() once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class DecodeResult:
    sequences: torch.Tensor  # (1, prompt_len + new_tokens): prompt then output, as HF generate
    prompt_len: int
    accept_lens: list[int]  # per verification forward: draft tokens accepted and kept (AR: 0)
    step_positions: list[int]  # per verification forward: N, the index of its root t_N
    step_nodes: list[int]  # per verification forward: the draft nodes it verified (AR: 0)
    tree_steps: int
    ar_steps: int
    wall_time_s: float  # prefill + decoding, device synchronised
    ended_by_eos: bool  # the output ends with one of the target's EOS tokens

    @property
    def new_tokens(self) -> int:
        return self.sequences.shape[1] - self.prompt_len

    @property
    def output_ids(self) -> torch.Tensor:
        return self.sequences[0, self.prompt_len :]  # (new_tokens,)

    @property
    def verify_forwards(self) -> int:
        return len(self.accept_lens)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accept_lens)

    @property
    def tau(self) -> float:
        """New tokens per verification forward, bonus included (nan if there was none)."""
        if self.verify_forwards == 0:
            return float("nan")
        return (self.new_tokens - 1) / self.verify_forwards

    @property
    def alpha(self) -> float:
        return self.accepted_tokens / self.new_tokens if self.new_tokens else float("nan")

    @property
    def step_tokens(self) -> list[int]:
        """Per verification forward: the new tokens it kept (accepted + bonus, fewer when EOS or
        max_new_tokens cut it), i.e. how far it moved the root."""
        end = self.prompt_len + self.new_tokens - 1  # the root after the last step
        return [b - a for a, b in pairwise([*self.step_positions, end])]

    def tau_by_phase(self, k: int) -> dict[int, dict]:
        """For each phase r in 0 .. k-1, over the verification forwards whose N mod k == r:
        {"steps": their count, "tokens": the new tokens they kept, "tau": tokens / steps (nan
        without steps)}. The phases' steps sum to verify_forwards, their tokens to
        new_tokens - 1; pool prompts by adding steps and tokens."""
        steps, tokens = [0] * k, [0] * k
        for n, kept in zip(self.step_positions, self.step_tokens, strict=True):
            steps[n % k] += 1
            tokens[n % k] += kept
        return {
            r: {"steps": s, "tokens": t, "tau": t / s if s else float("nan")}
            for r, (s, t) in enumerate(zip(steps, tokens, strict=True))
        }

    def stats(self) -> dict:
        """JSON-able summary; the counts pool across prompts."""
        return {
            "new_tokens": self.new_tokens,
            "verify_forwards": self.verify_forwards,
            "accepted_tokens": self.accepted_tokens,
            "tree_steps": self.tree_steps,
            "ar_steps": self.ar_steps,
            "tau": self.tau,
            "alpha": self.alpha,
            "wall_time_s": self.wall_time_s,
            "ended_by_eos": self.ended_by_eos,
        }


class Generation:
    """The running output of one decode call: appends tokens and stops exactly where plain
    greedy decoding (HF generate) stops, right after an EOS token or at max_new_tokens."""

    def __init__(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Iterable[int],
        stream: Callable[[list[int]], None] | None = None,
    ):
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"batch 1 only: input_ids (1, T), got {tuple(input_ids.shape)}")
        self.input_ids = input_ids
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos_token_ids)
        self.stream = stream  # called with the tokens each emit keeps, as they are accepted
        self.tokens: list[int] = []
        self.accept_lens: list[int] = []
        self.step_positions: list[int] = []
        self.step_nodes: list[int] = []
        self.tree_steps = self.ar_steps = 0
        self.ended_by_eos = False
        self.start = sync_clock(input_ids.device)

    @property
    def done(self) -> bool:
        return self.ended_by_eos or len(self.tokens) >= self.max_new_tokens

    def emit(self, tokens: list[int]) -> int:
        """Append tokens up to the first EOS (kept) or the budget; returns how many were kept.
        The kept ones go to `stream` (if given) at once."""
        kept = 0
        for t in tokens:
            if self.done:
                break
            self.tokens.append(t)
            self.ended_by_eos = t in self.eos
            kept += 1
        if kept and self.stream is not None:
            self.stream(self.tokens[-kept:])
        return kept

    def step(self, tokens: list[int], drafted: int, tree: bool, nodes: int = 0) -> None:
        """Record one verification forward of `nodes` draft nodes that produced `drafted`
        accepted draft tokens followed by a bonus token (`tokens`), from the root t_N,
        N = the index of the last token emitted so far."""
        self.step_positions.append(self.input_ids.shape[1] + len(self.tokens) - 1)
        self.step_nodes.append(nodes)
        kept = self.emit(tokens)
        self.accept_lens.append(min(drafted, kept))
        self.tree_steps += tree
        self.ar_steps += not tree

    def result(self) -> DecodeResult:
        wall = sync_clock(self.input_ids.device) - self.start
        new = torch.tensor([self.tokens], dtype=self.input_ids.dtype, device=self.input_ids.device)
        return DecodeResult(
            sequences=torch.cat([self.input_ids, new.view(1, -1)], dim=1),
            prompt_len=self.input_ids.shape[1],
            accept_lens=self.accept_lens,
            step_positions=self.step_positions,
            step_nodes=self.step_nodes,
            tree_steps=self.tree_steps,
            ar_steps=self.ar_steps,
            wall_time_s=wall,
            ended_by_eos=self.ended_by_eos,
        )
