"""Falcon tree decoding: scripted drafters with known predictions (tau), exact incremental feeding
of the drafter, stopping, and "speculative output == HF greedy output" for every tree, k and
fusion, random drafter weights included."""

import pytest
import torch
from test_decoding_ar import greedy, make_target, reference

from drafters.decoding import DrafterContext, build_falcon_tree, decode_falcon
from drafters.models import FalconConfig, FalconDrafter
from drafters.models.falcon import block_causal_mask
from drafters.testing import tiny_target

PROMPTS = ["The quick brown fox", "Hello, how are you?"]


class ScriptedFalcon(FalconDrafter):
    """A random-weight Falcon drafter told what to predict, which records its cached calls.

    It runs the real forward (so its KV cache is whatever the decoder makes of it), then may
    replace output j, read by the decoder as the guess of f_{j+k}, by the target's true feature
    f_{j+k} over a known greedy sequence ("right": its LM-head argmax is the true t_{j+k+1}) or
    by -f_{j+k} ("wrong": the argmax is the true token's argmin, never in a top-20 list).
    mode: "random" keeps the real outputs; "right" / "wrong" everywhere; "pass1": right in
    pass 1, wrong in tree passes; "mixed": right in pass 1, right with probability 0.7 per
    output in tree passes. Past the known sequence the real outputs are kept.
    """

    def __init__(self, cfg: FalconConfig, sequence=None, target=None, mode="random", seed=0):
        torch.manual_seed(seed)
        super().__init__(cfg)
        self.eval()
        self.mode = mode
        self.table = None if sequence is None else target.features(sequence[None])[0][0]
        self.gen = torch.Generator().manual_seed(seed)
        self.calls: list[dict] = []
        self.chain_end = 0  # end of the last chain forward (the whole-block cache)

    def forward(self, features, next_tokens, embed, attention_mask=None, position_ids=None,
                cache=None, attn_bias=None, slots=None):  # fmt: skip
        past = 0 if cache is None else cache.length
        out = super().forward(
            features, next_tokens, embed, attention_mask, position_ids, cache, attn_bias, slots
        )
        if cache is None:  # a reference forward of the test
            return out
        T = features.shape[1]
        pos = position_ids[0] if position_ids is not None else past + torch.arange(T)
        if attn_bias is None:
            kind, self.chain_end = "chain", past + T
        else:  # the realigned block re-reads committed positions; tree blocks start at N
            kind = "realigned" if int(pos[0]) < self.chain_end else "tree"
        tree = kind == "tree"
        self.calls.append(
            dict(past=past, T=T, kind=kind, tree=tree, pos=pos.tolist(), inputs=features.clone())
            | dict(tokens=next_tokens[0].tolist(), out=out.clone())
        )
        if self.mode == "random":
            return out
        if self.mode in ("right", "wrong"):
            right = torch.full((T,), self.mode == "right")
        elif self.mode == "pass1" or not tree:
            right = torch.full((T,), not tree)
        else:
            right = torch.rand(T, generator=self.gen) < 0.7
        out = out.clone()
        for i, j in enumerate(pos.tolist()):
            if j + self.k < len(self.table):
                truth = self.table[j + self.k]
                out[0, i] = truth if right[i] else -truth
        return out


def falcon(target, k, fusion="linear", kind=None, prompt=None, n=64, mode="random", seed=0,
           aux_layers=None):  # fmt: skip
    cfg = FalconConfig.from_target_config(target.config, k=k, fusion=fusion,
                                          aux_layers=aux_layers)  # fmt: skip
    if mode == "random":
        return ScriptedFalcon(cfg, seed=seed)
    sequence = reference(kind, prompt, n)[1][0]
    return ScriptedFalcon(cfg, sequence, make_target(kind), mode, seed)


@pytest.mark.parametrize(
    "k, tree, mode, a",
    [
        (1, "chain", "right", 4),
        (2, "chain", "right", 8),
        (3, "chain", "right", 12),
        (2, "kmask2_8layer_tree", "right", 8),
        (2, "falcon_k2_32", "right", 8),
        (1, "chain", "pass1", 1),
        (2, "chain", "pass1", 2),
        (3, "chain", "pass1", 3),
        (2, "kmask2_8layer_tree", "pass1", 2),
        (2, "chain", "wrong", 0),
        (3, "kmask2_8layer_tree", "wrong", 0),
    ],
)
def test_scripted_drafter_tau(k, tree, mode, a):
    n = 1 + 4 * (a + 1)  # the prefill's token + 4 whole steps
    kind, prompt = "seed0", PROMPTS[0]
    ids, ref = reference(kind, prompt, n)
    drafter = falcon(make_target(kind), k, kind=kind, prompt=prompt, n=n, mode=mode)
    res = decode_falcon(make_target(kind), drafter, ids, n, tree=tree)
    assert torch.equal(res.sequences, ref)
    assert res.accept_lens == [a] * 4 and res.tree_steps == 4 and res.ar_steps == 0
    assert res.tau == a + 1  # bonus included


BUILT = build_falcon_tree([[0.8**d * 0.4**r for r in range(4)] for d in range(1, 7)], 24, k=2)
TREES = ["chain", "kmask2_8layer_tree", "falcon_k2_32", BUILT]
CASES = [("seed0", PROMPTS[0]), ("seed3", PROMPTS[1]), ("tied", PROMPTS[1])]


@pytest.mark.parametrize("k, fusion", [(1, "linear"), (2, "linear"), (2, "lstm"), (3, "lstm")])
@pytest.mark.parametrize("tree", TREES, ids=["chain", "kmask2_8layer_tree", "k2_32", "built"])
def test_lossless_against_hf_greedy(k, fusion, tree):
    for kind, prompt in CASES:
        target = make_target(kind)
        for mode in ("random", "mixed"):
            drafter = falcon(target, k, fusion, kind, prompt, mode=mode, seed=len(prompt))
            for n in (2, 37):
                ids, ref = reference(kind, prompt, n)
                res = decode_falcon(target, drafter, ids, n, tree=tree)
                assert torch.equal(res.sequences, ref), (kind, mode, n)
                assert res.verify_forwards == res.tree_steps and res.ar_steps == 0


@pytest.mark.parametrize("k, fusion", [(1, "lstm"), (3, "linear"), (1, "eagle3"), (2, "eagle3")])
def test_lossless_other_k_fusion_pairs(k, fusion):
    target = make_target("seed0")
    for mode in ("random", "mixed"):
        drafter = falcon(target, k, fusion, "seed0", PROMPTS[1], mode=mode)
        ids, ref = reference("seed0", PROMPTS[1], 37)
        res = decode_falcon(target, drafter, ids, 37, tree="kmask2_8layer_tree")
        assert torch.equal(res.sequences, ref), mode


@pytest.mark.parametrize("k", [1, 2])
def test_lossless_with_eagle3_fused_features(k):
    """EAGLE-3's aux features: the decoder asks the target for the hidden state entering layer
    1 beside f, the drafter reads them wide on true positions (fc over the normed aux state)
    and its own outputs in tree passes; output == plain greedy."""
    target = make_target("seed0")
    d = target.hidden_size
    for mode in ("random", "mixed"):
        drafter = falcon(target, k, "eagle3", "seed0", PROMPTS[1], mode=mode, aux_layers=(1,))
        ids, ref = reference("seed0", PROMPTS[1], 37)
        res = decode_falcon(target, drafter, ids, 37, tree="kmask2_8layer_tree")
        assert torch.equal(res.sequences, ref), mode
        widths = {c["kind"]: c["inputs"].shape[-1] for c in drafter.calls}
        assert widths["chain"] == 2 * d and widths["tree"] == d, widths


@pytest.mark.parametrize("k", [2, 3])
def test_prompt_shorter_than_k_starts_with_ar_steps(k):
    kind, prompt, n = "seed3", "A", 30  # a 1-token prompt
    ids, ref = reference(kind, prompt, n)
    assert ids.shape[1] == 1
    drafter = falcon(make_target(kind), k, "lstm", kind, prompt, mode="right")
    res = decode_falcon(make_target(kind), drafter, ids, n, tree="chain")
    assert torch.equal(res.sequences, ref)
    assert res.ar_steps == k - 1 and res.accept_lens[: k - 1] == [0] * (k - 1)
    assert res.accept_lens[k - 1] == 4 * k  # then full blocks


def test_eos_inside_an_accepted_path():
    target, prompt = tiny_target(seed=0), PROMPTS[0]  # a fresh target: eos is changed below
    ids, ref = reference("seed0", prompt, 64)
    out = ref[0, ids.shape[1] :].tolist()
    # k = 2, chain of depth 8: steps emit out[1:10], out[10:19], ...; a draft token iff j % 9
    j = next(j for j in range(10, 64) if j % 9 and out.index(out[j]) == j)
    target.model.generation_config.eos_token_id = [target.tokenizer.eos_token_id, out[j]]
    drafter = falcon(target, 2, kind="seed0", prompt=prompt, mode="right")
    res = decode_falcon(target, drafter, ids, 64, tree="chain")
    assert torch.equal(res.sequences, greedy(target, ids, 64))
    assert res.ended_by_eos and res.new_tokens == j + 1 and res.output_ids[-1] == out[j]
    assert res.accept_lens[-1] == (j - 1) % 9 + 1  # stopped right after the EOS draft token


@pytest.mark.parametrize("n", [1, 2, 13, 18, 19])
def test_max_new_tokens_inside_an_accepted_path(n):
    ids, ref = reference("seed0", PROMPTS[0], n)
    drafter = falcon(make_target("seed0"), 2, kind="seed0", prompt=PROMPTS[0], mode="right")
    res = decode_falcon(make_target("seed0"), drafter, ids, n, tree="chain")
    assert torch.equal(res.sequences, ref) and res.new_tokens == n
    full, part = divmod(n - 1, 9)
    assert res.accept_lens == [8] * full + ([part] if part else [])
    assert torch.equal(decode_falcon(make_target("seed0"), drafter, ids, 0).sequences, ids)


def _steps(calls):
    """Group recorded calls into decoding steps: (pass-1 calls, tree calls) each."""
    steps = []
    for c in calls:
        if not c["tree"] and (not steps or steps[-1][1]):
            steps.append(([], []))
        steps[-1][1 if c["tree"] else 0].append(c)
    return steps


def pass1_reference(drafter, embed, f, t, N):
    """What pass 1 must give at N committed positions, computed in one go: the drafter's full
    forward when N mod k = 0; else the whole aligned blocks, then the block N-k .. N-1 seeing
    positions < N-k only (LSTM: its recurrence restarted from the state after N-k-1)."""
    k = drafter.cfg.k
    if N % k == 0:
        return FalconDrafter.forward(drafter, f[:, :N], t[:, :N], embed)[:, -k:]
    A = N // k * k
    cache = drafter.new_cache()
    FalconDrafter.forward(drafter, f[:, :A], t[:, :A], embed, cache=cache)
    if drafter.cfg.fusion == "lstm":
        cache.lstm_state = drafter.fusion_state(f[:, : N - k], t[:, : N - k], embed, None)
    seen = torch.arange(A) < N - k
    bias = torch.cat([seen.expand(k, A), torch.ones(k, k, dtype=torch.bool)], dim=1)
    pos = torch.arange(N - k, N).view(1, k)
    window = (f[:, N - k : N], t[:, N - k : N])
    return FalconDrafter.forward(drafter, *window, embed, position_ids=pos, cache=cache,
                                 attn_bias=bias[None, None])  # fmt: skip


@pytest.mark.parametrize("k, fusion", [(1, "linear"), (2, "linear"), (2, "lstm"), (3, "lstm")])
def test_pass1_is_exact_and_the_cache_holds_no_tree_entries(k, fusion):
    kind, prompt, n = "seed3", PROMPTS[0], 40
    target = make_target(kind)
    ids, ref = reference(kind, prompt, n)
    drafter = falcon(target, k, fusion, kind, prompt, n, mode="mixed", seed=3)
    res = decode_falcon(target, drafter, ids, n, tree="falcon_k2_32")
    assert torch.equal(res.sequences, ref)
    assert len(set(res.accept_lens)) > 2  # varied accepted lengths, so all tail sizes occur
    seq = ref[0].tolist()
    f_ref = target.features(ref)[0]  # (1, L, d)
    nxt = ref[:, 1:]
    steps = _steps(drafter.calls)
    assert len(steps) == res.verify_forwards
    fed = ids.shape[1]  # positions fed to the drafter after the prefill: the whole prompt
    cached = 0
    phases = set()
    for s, (first, tree) in enumerate(steps):
        chain = [c for c in first if c["kind"] == "chain"]
        realigned = [c for c in first if c["kind"] == "realigned"]
        whole = k * (fed // k)
        # the whole-block cache grows from where it stood, contiguously, to the last whole block
        for a, b in zip(chain, chain[1:], strict=False):
            assert b["past"] == a["past"] + a["T"]
        if chain:
            assert chain[0]["past"] == cached and chain[-1]["past"] + chain[-1]["T"] == whole
        for c in chain:  # whole aligned blocks equal the drafter's full forward
            end = c["past"] + c["T"]
            full = FalconDrafter.forward(drafter, f_ref[:, :end], nxt[:, :end], target.embed_tokens)
            torch.testing.assert_close(c["out"], full[:, c["past"] :], atol=1e-4, rtol=0)
            assert c["tokens"] == seq[c["past"] + 1 : end + 1]
        # r > 0: one realigned block over the last k committed pairs, on the whole blocks only
        assert len(realigned) == (fed % k > 0)
        out = realigned[0]["out"] if realigned else chain[-1]["out"][:, -k:]
        if realigned:
            assert realigned[0]["past"] == whole
            assert realigned[0]["pos"] == list(range(fed - k, fed))
        want = pass1_reference(drafter, target.embed_tokens, f_ref, nxt, fed)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=0)
        phases.add(fed % k)
        # pass 2 reads pass 1's k outputs (the scripted f_fed .. f_fed+k-1) and the block-0
        # tokens at positions fed .. fed+k-1; tree passes sit on top of the pass-1 cache
        assert tree[0]["past"] == whole + k * bool(realigned)
        assert tree[0]["pos"][:k] == list(range(fed, fed + k))
        inputs = tree[0]["inputs"].view(-1, k, f_ref.shape[-1])
        if fed + k < len(seq):
            torch.testing.assert_close(inputs, f_ref[:, fed : fed + k].expand_as(inputs))
            assert tree[0]["tokens"][:k] == seq[fed + 1 : fed + k + 1]
        for a, b in zip(tree, tree[1:], strict=False):
            assert b["past"] == a["past"] + a["T"]
        cached = whole
        fed += res.accept_lens[s] + 1  # the root and the accepted nodes, fed by the next pass 1
    assert phases == set(range(k))  # every N mod k occurred


@pytest.mark.parametrize("k, fusion", [(1, "lstm"), (2, "linear"), (2, "lstm"), (3, "lstm")])
@pytest.mark.parametrize("assignment", ["paper", "reversed"])
def test_drafter_context_equals_one_shot_pass1(k, fusion, assignment):
    """Random chunks fed with tree-like garbage on top in between: pass 1 stays exact."""
    d, v, L = 16, 30, 40
    torch.manual_seed(0)
    cfg = FalconConfig(d, v, k=k, num_attention_heads=4, intermediate_size=24, fusion=fusion,
                       assignment=assignment)  # fmt: skip
    drafter, embed = FalconDrafter(cfg).eval(), torch.nn.Embedding(v, d)
    gen = torch.Generator().manual_seed(k)
    f, t = torch.randn(1, L, d, generator=gen), torch.randint(v, (1, L), generator=gen)
    ctx = DrafterContext(drafter, embed)
    fed = 0
    with torch.inference_mode():
        while fed < L:
            n = min(int(torch.randint(1, 6, (), generator=gen)), L - fed)
            out = ctx.extend(f[:, fed : fed + n], t[:, fed : fed + n])
            fed += n
            if fed < k:
                assert out is None
            else:
                want = pass1_reference(drafter, embed, f, t, fed)
                torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
            whole = k * (fed // k)
            assert ctx.cache.length == whole + (k if fed % k and fed >= k else 0)
            assert ctx.visible.shape == (ctx.cache.length,)
            assert int(ctx.visible.sum()) == (fed if fed >= k else whole)
            bias = torch.ones(1, 1, 2 * k, ctx.cache.length + 2 * k, dtype=torch.bool)
            drafter(f[:, : 2 * k], t[:, : 2 * k], embed, cache=ctx.cache, attn_bias=bias)
            ctx.truncate()
            assert ctx.cache.length == whole == ctx.cached
            if fusion == "lstm" and ctx.cached:
                assert ctx.cache.lstm_length == ctx.cached


def test_realigned_block_is_one_forward_over_the_decode_mask():
    """Linear fusion: pass 1 at N mod k > 0 equals one cache-free forward over the positions
    [0 .. A-1 ; N-k .. N-1] with the aligned mask on the first part and the realigned block
    seeing keys < N-k and itself."""
    d, v, k = 16, 30, 3
    torch.manual_seed(1)
    drafter = FalconDrafter(FalconConfig(d, v, k=k, num_attention_heads=4, intermediate_size=24))
    drafter, embed = drafter.eval(), torch.nn.Embedding(v, d)
    f, t = torch.randn(1, 20, d), torch.randint(v, (1, 20))
    with torch.inference_mode():
        for N in (7, 8, 13):
            A = N // k * k
            ctx = DrafterContext(drafter, embed)
            out = ctx.extend(f[:, :N], t[:, :N])
            idx = torch.cat([torch.arange(A), torch.arange(N - k, N)])
            mask = torch.zeros(A + k, A + k, dtype=torch.bool)
            mask[:A, :A] = block_causal_mask(A, k)
            mask[A:, :A] = torch.arange(A) < N - k
            mask[A:, A:] = True
            full = drafter(f[:, idx], t[:, idx], embed, position_ids=idx.view(1, -1),
                           attn_bias=mask[None, None])  # fmt: skip
            torch.testing.assert_close(out, full[:, A:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("assignment", ["paper", "reversed"])
def test_depth1_draft_depends_on_the_root_pair_at_every_phase(k, assignment):
    """The root t_N is read at position N-1 (paired with f_{N-1}); depth 1 must see it for every
    N mod k, as in training, where the block's first slot sees its whole block."""
    d, v = 16, 30
    torch.manual_seed(k)
    cfg = FalconConfig(d, v, k=k, num_attention_heads=4, intermediate_size=24,
                       assignment=assignment)  # fmt: skip
    drafter, embed = FalconDrafter(cfg).eval(), torch.nn.Embedding(v, d)
    f, t = torch.randn(1, 3 * k + 1, d), torch.randint(v - 1, (1, 3 * k + 1))
    with torch.inference_mode():
        for N in range(k, 2 * k + 1):  # every N mod k
            outs = []
            for root in (t[0, N - 1], t[0, N - 1] + 1):
                tokens = t[:, :N].clone()
                tokens[0, N - 1] = root
                ctx = DrafterContext(drafter, embed)
                ctx.extend(f[:, : N - 1], tokens[:, : N - 1])  # then the root's pair alone
                outs.append(ctx.extend(f[:, N - 1 : N], tokens[:, N - 1 : N]))
            assert (outs[0][0, 0] - outs[1][0, 0]).abs().max() > 1e-4, (N, N % k)


@pytest.mark.slow
def test_lossless_on_the_embedded_target(smollm2):
    """Real weights (SmolLM2-135M) and a random Falcon drafter of its shape."""
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt").input_ids
    ref = greedy(smollm2, ids, 24)
    for k, fusion, tree in [(2, "linear", "kmask2_8layer_tree"), (3, "lstm", "falcon_k2_32")]:
        torch.manual_seed(0)
        cfg = FalconConfig.from_target_config(smollm2.config, k=k, fusion=fusion)
        res = decode_falcon(smollm2, FalconDrafter(cfg).eval(), ids, 24, tree=tree)
        assert torch.equal(res.sequences, ref), (k, fusion)
