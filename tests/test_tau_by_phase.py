"""τ split by N mod k (N: the index of a verification forward's root t_N): `Generation` records
each step's N, `DecodeResult.tau_by_phase` counts what each phase kept, EOS and max_new_tokens
cuts included, and the bench report pools the counts over prompts into a column."""

import math
from itertools import pairwise

import pytest
import torch

from drafters.decoding import decode_ar, decode_falcon
from drafters.decoding.result import Generation
from drafters.eval.report import markdown, summarize
from drafters.models import FalconConfig, FalconDrafter

EOS = 99
SETTINGS = {"bench": "b", "questions": 2, "turns": 1, "max_new_tokens": 16, "dtype": "float32",
            "device": "cpu", "threads": 1, "target": {"name": "tiny"}}  # fmt: skip


def scripted(prompt_len: int, max_new_tokens: int, steps: list[tuple[list[int], int]]):
    """A DecodeResult from a prefill token then `steps` of (tokens, drafted)."""
    gen = Generation(torch.zeros(1, prompt_len, dtype=torch.long), max_new_tokens, [EOS])
    gen.emit([7])  # the prefill's token
    for tokens, drafted in steps:
        gen.step(tokens, drafted=drafted, tree=drafted > 0)
    return gen.result()


def test_steps_record_their_root_and_an_eos_cut_counts_what_was_kept():
    # prompt of 5: the first root is t_5; the last step drafts 2 but EOS ends it after 2 tokens
    res = scripted(5, 20, [([1, 2, 3], 2), ([4], 0), ([5, 6], 1), ([8, EOS, 11], 2)])
    assert res.step_positions == [5, 8, 9, 11]
    assert res.step_tokens == [3, 1, 2, 2] and res.accept_lens == [2, 0, 1, 2]
    assert res.new_tokens == 9 and res.ended_by_eos
    assert res.tau_by_phase(2) == {
        0: {"steps": 1, "tokens": 1, "tau": 1.0},  # N = 8
        1: {"steps": 3, "tokens": 7, "tau": 7 / 3},  # N = 5, 9, 11
    }
    by3 = res.tau_by_phase(3)  # N mod 3: 2, 2, 0, 2
    assert by3[0] == {"steps": 1, "tokens": 2, "tau": 2.0}
    assert by3[1]["steps"] == by3[1]["tokens"] == 0 and math.isnan(by3[1]["tau"])
    assert by3[2] == {"steps": 3, "tokens": 6, "tau": 2.0}


def test_a_max_new_tokens_cut_counts_what_was_kept():
    # 3 accepted + the bonus, but the budget keeps 3 of those 4 tokens
    res = scripted(3, 4, [([2, 3, 4, 5], 3)])
    assert res.step_positions == [3] and res.step_tokens == [3] and res.accept_lens == [3]
    phases = res.tau_by_phase(2)
    assert phases[1] == {"steps": 1, "tokens": 3, "tau": 3.0} and res.tau == 3.0
    assert phases[0]["steps"] == phases[0]["tokens"] == 0 and math.isnan(phases[0]["tau"])


def test_ar_decoding_has_one_step_per_position(tiny):
    ids = tiny.tokenizer("Hello, how are you?", return_tensors="pt").input_ids
    res = decode_ar(tiny, ids, 12)
    T = ids.shape[1]
    assert res.step_positions == list(range(T, T + res.new_tokens - 1))
    steps = res.new_tokens - 1
    assert res.tau_by_phase(1) == {0: {"steps": steps, "tokens": steps, "tau": 1.0}}


@pytest.mark.parametrize("k", [2, 3])
def test_falcon_phases_add_up_to_the_decode(tiny, k):
    torch.manual_seed(0)
    drafter = FalconDrafter(FalconConfig.from_target_config(tiny.config, k=k)).eval()
    for prompt in ["A", "The quick brown fox", "Hello, you?"]:
        ids = tiny.tokenizer(prompt, return_tensors="pt").input_ids
        for n in (1, 2, 29):
            res = decode_falcon(tiny, drafter, ids, n)
            assert len(res.step_positions) == res.verify_forwards
            if res.verify_forwards:
                assert res.step_positions[0] == ids.shape[1]  # the prefill's token is the root
            moves = [b - a for a, b in pairwise(res.step_positions)]
            assert moves == [a + 1 for a in res.accept_lens[:-1]]  # not cut: accepted + bonus
            phases = res.tau_by_phase(k)
            assert list(phases) == list(range(k))
            assert sum(p["steps"] for p in phases.values()) == res.verify_forwards
            assert sum(p["tokens"] for p in phases.values()) == res.new_tokens - 1


def turn(phases: dict | None, new_tokens: int, forwards: int) -> dict:
    t = {"new_tokens": new_tokens, "verify_forwards": forwards, "accepted_tokens": 0}
    return t if phases is None else {**t, "tau_by_phase": phases}


def record(method: str, question: int, turns: list[dict]) -> dict:
    return {"question_id": question, "category": "c", "method": method, "lossless": True,
            "new_tokens": sum(t["new_tokens"] for t in turns), "tokens_per_s": 10.0,
            "turns": turns}  # fmt: skip


def test_the_report_pools_phases_over_prompts_and_shows_them():
    one = {"0": {"steps": 2, "tokens": 5}, "1": {"steps": 1, "tokens": 1}}
    two = {"0": {"steps": 1, "tokens": 1}, "1": {"steps": 0, "tokens": 0}}
    records = [
        record("ar", 1, [turn(None, 5, 4)]),
        record("falcon", 1, [turn(one, 7, 3)]),
        record("ar", 2, [turn(None, 3, 2)]),
        record("falcon", 2, [turn(two, 2, 1)]),
    ]
    rows = {(r["method"], r["category"]): r for r in summarize(records, ["ar", "falcon"], "ar")}
    assert rows["ar", "all"]["tau_by_phase"] is None
    assert rows["falcon", "all"]["tau_by_phase"] == {
        "0": {"steps": 3, "tokens": 6, "tau": 2.0},
        "1": {"steps": 1, "tokens": 1, "tau": 1.0},
    }
    assert rows["falcon", "all"]["tau"] == 7 / 4
    table = markdown(list(rows.values()), SETTINGS)
    assert "| lossless | τ by N mod k |" in table
    assert "| yes (2/2) | 0: 2.00 / 1: 1.00 |" in table
    ar_only = markdown([r for r in rows.values() if r["method"] == "ar"], SETTINGS)
    assert "τ by N mod k" not in ar_only
