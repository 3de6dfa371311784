"""Static-tree head decoding: stub drafters with hand-written predictions, stopping, the gate,
and "speculative output == HF greedy output" for every kind of tree."""

import math

import pytest
import torch
from test_decoding_ar import greedy, make_target, reference
from torch import nn

from drafters.decoding import build_tree, decode_heads, get_tree, measure_cost_ratio
from drafters.target import Target
from drafters.testing import tiny_target

K = 4  # heads
PROMPTS = ["The quick brown fox", "Hello, how are you?"]


class OracleHeads(nn.Module):
    """A head drafter with hand-written predictions from a known greedy sequence.

    It finds its position j by the feature it is given (the nearest row of the target's own
    features over `sequence`), then ranks, for head i, the true token t_{j+2+i} at
    `ranks[i]`: every other token is a decoy, so a decoy is always wrong. ranks[i] = None puts
    the true token last, so that head never drafts it.
    """

    def __init__(self, target: Target, sequence: torch.Tensor, ranks: list[int | None]):
        super().__init__()
        self.register_buffer("table", target.features(sequence[None])[0][0])  # (L, d)
        self.sequence = sequence.tolist()  # (L,) prompt + greedy continuation
        self.ranks = ranks

    def head_logits(self, j: int, head: int, vocab: int) -> torch.Tensor:
        logits = -torch.arange(vocab, dtype=torch.float32)  # decoys: token r at rank r
        if j + 2 + head >= len(self.sequence):
            return logits  # past the known sequence: decoys only
        truth, rank = self.sequence[j + 2 + head], self.ranks[head]
        decoys = [t for t in range(vocab) if t != truth]
        logits[truth] = -math.inf if rank is None else -decoys[rank] + 0.5  # just above decoy
        return logits

    def forward(self, features: torch.Tensor, lm_head: nn.Linear) -> torch.Tensor:
        b, t, d = features.shape
        rows = torch.cdist(features.reshape(-1, d).float(), self.table.float()).argmin(-1)
        v = lm_head.out_features
        logits = [torch.stack([self.head_logits(j, i, v) for i in range(K)]) for j in rows.tolist()]
        return torch.stack(logits).view(b, t, K, v)  # (B, T, K, V)


class RandomHeads(nn.Module):
    """A random-weight head drafter: head i = the LM head on (I + noise_i) f."""

    def __init__(self, d: int, seed: int = 0, noise: float = 0.3):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.maps = nn.Parameter(
            torch.eye(d) + noise * torch.randn(K, d, d, generator=gen) / d**0.5
        )

    def forward(self, features: torch.Tensor, lm_head: nn.Linear) -> torch.Tensor:
        u = torch.einsum("kij,btj->btki", self.maps, features)  # (B, T, K, d)
        return lm_head(u)  # (B, T, K, V)


class NoDrafter(nn.Module):
    def forward(self, features, lm_head):
        raise AssertionError("an AR step must not run the drafter")


def oracle(kind, prompt, ranks, n=64):
    target = make_target(kind)
    return OracleHeads(target, reference(kind, prompt, n)[1][0], ranks)


BUILT = build_tree([[0.7 ** (i + 1) * 0.5**r for r in range(5)] for i in range(K)], 24)
TREES = {"chain4": get_tree("chain4"), "mc_sim_7b_63": get_tree("mc_sim_7b_63"), "built": BUILT}


@pytest.mark.parametrize(
    "tree, ranks, a",
    [
        ("chain4", [0, 0, 0, 0], 4),
        ("mc_sim_7b_63", [0, 0, 0, 0], 4),
        ("mc_sim_7b_63", [0, None, None, None], 1),
        ("mc_sim_7b_63", [None, None, None, None], 0),
        ("mc_sim_7b_63", [1, 0, 0, 0], 3),  # (1, 0, 0) is the deepest path starting with rank 1
        ("mc_sim_7b_63", [0, 3, 0, 0], 3),
        ("chain4", [0, 1, 0, 0], 1),
    ],
)
def test_oracle_stub_accepts_what_it_was_told(tree, ranks, a):
    n = 1 + 8 * (a + 1)  # the prefill's token + 8 whole steps
    ids, ref = reference("seed0", PROMPTS[0], n)
    res = decode_heads(make_target("seed0"), oracle("seed0", PROMPTS[0], ranks), tree, ids, n)
    assert torch.equal(res.sequences, ref)
    assert res.accept_lens == [a] * 8 and res.tree_steps == 8
    assert res.tau == a + 1 and res.alpha == 8 * a / n


@pytest.mark.parametrize("kind", ["seed0", "seed3", "tied"])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("tree", list(TREES))
def test_lossless_against_hf_greedy(kind, prompt, tree):
    target = make_target(kind)
    drafters = {
        "oracle": oracle(kind, prompt, [0, 0, 0, 0]),
        "partial": oracle(kind, prompt, [0, 2, None, 1]),
        "random": RandomHeads(target.hidden_size, seed=len(prompt)),
    }
    for name, drafter in drafters.items():
        for n in (2, 23, 40):
            ids, ref = reference(kind, prompt, n)
            res = decode_heads(target, drafter, TREES[tree], ids, n)
            assert torch.equal(res.sequences, ref), (name, n)
            assert res.verify_forwards == res.tree_steps and res.ar_steps == 0


def test_eos_inside_an_accepted_path():
    target, prompt = tiny_target(seed=0), PROMPTS[0]  # a fresh target: eos is changed below
    ids, ref = reference("seed0", prompt, 64)
    out = ref[0, ids.shape[1] :].tolist()
    # steps emit out[1:6], out[6:11], ...; out[k] is a draft token iff k % 5 != 0
    k = next(k for k in range(6, 64) if k % 5 and out.index(out[k]) == k)
    target.model.generation_config.eos_token_id = [target.tokenizer.eos_token_id, out[k]]
    drafter = oracle("seed0", prompt, [0, 0, 0, 0])
    res = decode_heads(target, drafter, "chain4", ids, 64)
    assert torch.equal(res.sequences, greedy(target, ids, 64))
    assert res.ended_by_eos and res.new_tokens == k + 1 and res.output_ids[-1] == out[k]
    assert res.accept_lens[-1] == (k - 1) % 5 + 1  # stopped right after the EOS draft token


@pytest.mark.parametrize("n", [1, 13, 14, 15])
def test_max_new_tokens_inside_an_accepted_path(n):
    ids, ref = reference("seed0", PROMPTS[0], n)
    res = decode_heads(make_target("seed0"), oracle("seed0", PROMPTS[0], [0] * 4), "chain4", ids, n)
    assert torch.equal(res.sequences, ref) and res.new_tokens == n
    assert res.accept_lens == [4] * ((n - 1) // 5) + ([(n - 1) % 5] if (n - 1) % 5 else [])


class ScriptedGate:
    """Says E[a] from a repeating script, and records what it was shown."""

    def __init__(self, script):
        self.script, self.seen = script, []

    def expected_accept(self, features, target_logits):
        self.seen.append((features.clone(), target_logits.clone()))
        return torch.tensor(self.script[(len(self.seen) - 1) % len(self.script)])


def test_gate_forced_ar_and_forced_tree():
    target = make_target("seed0")
    ids, ref = reference("seed0", PROMPTS[1], 30)
    res = decode_heads(target, NoDrafter(), "mc_sim_7b_63", ids, 30, threshold_override=math.inf)
    assert torch.equal(res.sequences, ref)
    assert res.tree_steps == 0 and res.ar_steps == 29 and res.tau == 1.0
    drafter = oracle("seed0", PROMPTS[1], [0, 0, 0, 0])
    gate = ScriptedGate([0.0])
    res = decode_heads(target, drafter, "chain4", ids, 30, gate, threshold_override=-math.inf)
    assert torch.equal(res.sequences, ref) and res.ar_steps == 0 and res.tree_steps > 0
    with pytest.raises(ValueError, match="needs a gate"):
        decode_heads(target, drafter, "chain4", ids, 30, threshold_override=1.0)


def test_gate_mixes_steps_and_reads_the_last_logits():
    kind, prompt, n = "seed3", PROMPTS[0], 40
    target = make_target(kind)
    ids, ref = reference(kind, prompt, n)
    drafter = oracle(kind, prompt, [0, 0, None, None])
    script = [5.0, 0.0, 0.0, 5.0, 0.5, 1.5]  # threshold = cost_ratio - 1 = 1.0
    gate = ScriptedGate(script)
    res = decode_heads(target, drafter, "mc_sim_7b_63", ids, n, gate, cost_ratio=2.0)
    assert torch.equal(res.sequences, ref)
    assert res.verify_forwards == len(gate.seen)
    tree = [script[k % len(script)] > 1.0 for k in range(res.verify_forwards)]
    assert res.tree_steps == sum(tree) > 0 and res.ar_steps == len(tree) - sum(tree) > 0
    assert [a for a, t in zip(res.accept_lens, tree, strict=True) if t] == [2] * sum(tree)
    assert [a for a, t in zip(res.accept_lens, tree, strict=True) if not t] == [0] * res.ar_steps
    # decision k sees f_j and p_j at the position j whose next token is the pending root
    f_ref, logits_ref = target.features(ref, return_logits=True)
    emitted, p = 1, ids.shape[1]
    for (f, logits), a in zip(gate.seen, res.accept_lens, strict=True):
        j = p + emitted - 2
        torch.testing.assert_close(f, f_ref[:, j : j + 1], atol=1e-4, rtol=0)
        torch.testing.assert_close(logits, logits_ref[:, j : j + 1], atol=1e-4, rtol=0)
        emitted += a + 1


def test_measured_cost_ratio_sets_the_threshold():
    target = make_target("seed0")
    ratio = measure_cost_ratio(target, get_tree("mc_sim_7b_63"), prompt_len=16, reps=2, warmup=1)
    assert math.isfinite(ratio) and ratio > 0
    ids, ref = reference("seed0", PROMPTS[0], 12)
    drafter = oracle("seed0", PROMPTS[0], [0, 0, 0, 0])
    res = decode_heads(target, drafter, "chain4", ids, 12, ScriptedGate([100.0]))  # measured
    assert torch.equal(res.sequences, ref) and res.ar_steps == 0
