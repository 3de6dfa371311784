"""The plain AR loop equals HF greedy generate token for token, and its stats say tau = 1."""

import functools

import pytest
import torch
from transformers import LlamaForCausalLM

from drafters.decoding import decode_ar
from drafters.target import Target
from drafters.testing import tiny_target

PROMPTS = ["The quick brown fox", "def f(x):"]


def tied_target(seed: int) -> Target:
    """A tiny target whose LM head is its input embedding (tie_word_embeddings=True).

    A tied random model mostly predicts its input token again; random signs on the final norm
    weight break that, so greedy output varies.
    """
    base = tiny_target(seed=seed)
    config = base.config
    config.tie_word_embeddings = True
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        signs = torch.randint(0, 2, (config.hidden_size,)) * 2.0 - 1
    with torch.no_grad():
        model.model.norm.weight.copy_(signs)
    model.generation_config.eos_token_id = base.tokenizer.eos_token_id
    model.generation_config.pad_token_id = base.tokenizer.pad_token_id
    target = Target(model, base.tokenizer, f"tiny-tied-seed{seed}")
    assert target.lm_head.weight is target.embed_tokens.weight
    return target


def greedy(target: Target, ids: torch.Tensor, n: int) -> torch.Tensor:
    mask = torch.ones_like(ids)
    return target.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n)


# Shared by the decoding tests: targets by name ("seed0", "seed3", "tied") and their cached
# HF greedy references.
@functools.cache
def make_target(kind: str) -> Target:
    return tied_target(seed=1) if kind == "tied" else tiny_target(seed=int(kind[-1]))


@functools.cache
def reference(kind: str, prompt: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (1, P), HF greedy sequences (1, P + n))."""
    target = make_target(kind)
    ids = target.tokenizer(prompt, return_tensors="pt").input_ids
    return ids, greedy(target, ids, n)


@pytest.mark.parametrize(
    "make",
    [lambda: tiny_target(seed=1), lambda: tiny_target(seed=2), lambda: tied_target(seed=1)],
    ids=["seed1", "seed2", "tied"],
)
def test_ar_equals_hf_greedy(make):
    target = make()
    for prompt in PROMPTS:
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        for n in (1, 2, 33):
            ref = greedy(target, ids, n)
            res = decode_ar(target, ids, n)
            assert torch.equal(res.sequences, ref), (prompt, n)
            assert res.new_tokens == ref.shape[1] - ids.shape[1]
            assert res.verify_forwards == res.new_tokens - 1 == res.ar_steps
            assert res.tree_steps == 0 and res.accepted_tokens == 0 and res.alpha == 0
            if n > 1:
                assert res.tau == 1.0


def test_ar_stops_after_eos_like_hf():
    target = tiny_target(seed=0)
    ids = target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    out = greedy(target, ids, 30)[0, ids.shape[1] :].tolist()
    eos = out[9]  # first occurrence at some index <= 9
    target.model.generation_config.eos_token_id = [target.tokenizer.eos_token_id, eos]
    ref = greedy(target, ids, 30)
    res = decode_ar(target, ids, 30)
    assert torch.equal(res.sequences, ref)
    assert res.ended_by_eos and res.output_ids[-1] == eos and res.new_tokens == out.index(eos) + 1
    assert decode_ar(target, ids, 0).new_tokens == 0
