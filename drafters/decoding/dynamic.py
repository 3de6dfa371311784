"""Trees that adapt (docs/design.md section 5): each step builds its own candidate tree from the
drafter's confidence (EAGLE-2 style) and from n-gram lookup, and verifies the number of nodes
that maximises expected tokens per second on this machine, 0 meaning a plain AR step.

One step from the root t_N (emitted, not yet in the target's cache):
  1. candidates (`drafters.decoding.candidates.CandidateTree`), each with an estimate of
     P(its path is the target's greedy continuation):
     - head drafters (Medusa, Cerberus): head i's top `width` tokens with their softmax
       probabilities; a path's estimate is the product along it; the `max_nodes` best paths,
       best first. Every source adds up to `max_nodes` candidates; the budget picks among all.
     - Falcon: pass 1 gives depths 1..k; then, per further pass, the `anchors` best nodes at
       the block's last depth are expanded by one drafter block each (`FalconProposer`), while
       the best anchor's estimate is at least `min_anchor`.
     - n-gram lookup (`drafters.decoding.ngram`): the continuation of the latest earlier
       occurrence of the context's last n tokens; merged into
       the same tree (a token both sources propose is one node); `ngram_prior` is each
       token's P(right | its parent right) before calibration, by matched n-gram length.
     Estimates are calibrated online per source and depth (`Calibration`); a source is
     verified a few times before a budget of 0 is trusted, and again every `explore_every`
     AR steps in a row (one node each time), so calibration always has evidence.
     With a gate (head drafters: `budget+entropy`, `hybrid+learned`, ...), the heads' own
     per-depth confidences are first rescaled so that their top-1 chain matches what the gate
     predicts for this step (`gate_conditionals`): the learned gate's P(heads 0..i right) per
     depth, or the entropy gate's expected accepted length, spread over the depths in the
     heads' own proportions. The gate thus feeds the budget instead of only choosing between
     the full tree and an AR step.
  2. the budget: with the target forward's cost by rows measured on this machine (t(n)/t(1),
     `forward_cost_profile`), n = argmax (1 + sum of the n best estimates) / t(n + 1) / t(1)
     (`choose_budget`); a fixed `budget` verifies that many nodes instead.
  3. verification of the n best nodes in one target forward (`verify_tree`), or an AR step.
Greedy and lossless whatever the estimates: they decide what is verified, never what is kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from drafters.decoding.cache import new_cache, target_forward
from drafters.decoding.candidates import Calibration, CandidateTree, choose_budget
from drafters.decoding.cost import cost_profile
from drafters.decoding.linears import fitted, project
from drafters.decoding.ngram import NgramIndex
from drafters.decoding.result import DecodeResult, Generation
from drafters.decoding.verify import verify_tree
from drafters.models import aux_layers_of
from drafters.models.gate import LearnedGate
from drafters.models.vocab import to_target
from drafters.target import Target


@dataclass(frozen=True)
class DynamicConfig:
    """How a dynamic step drafts and sizes its tree."""

    max_nodes: int = 16  # candidates per step at most: the budget's upper bound
    width: int = 4  # top tokens per depth a drafter contributes
    budget: int | None = None  # None: chosen per step by cost; an int: always that many nodes
    drafter: bool = True  # False: n-gram candidates only
    ngram: int = 3  # longest n-gram looked up (0: no n-gram candidates)
    ngram_tokens: int = 8  # continuation length
    ngram_prior: float = 0.5  # P(an n-gram token right | its parent right), before calibration
    anchors: int = 2  # Falcon: drafter blocks per pass after the first
    passes: int = 3  # Falcon: drafter passes at most (depth k * passes)
    min_anchor: float = 0.2  # Falcon: run another pass only if its best anchor is this likely
    # Exploration, so that calibration sees a source before trusting a budget of 0: verify the
    # best node alone when one of its sources has fewer than explore_min verified nodes at
    # depth 1, or after explore_every AR steps in a row
    explore_min: int = 2
    explore_every: int = 32

    def __post_init__(self):
        if self.max_nodes < 1 or self.width < 1 or self.passes < 1 or self.anchors < 1:
            raise ValueError(f"{self}: max_nodes, width, passes and anchors must be >= 1")
        if self.budget is not None and not 0 <= self.budget <= self.max_nodes:
            raise ValueError(f"budget {self.budget} must be in [0, max_nodes={self.max_nodes}]")
        if not 0.0 < self.ngram_prior <= 1.0:
            raise ValueError(f"ngram_prior {self.ngram_prior} must be in (0, 1]")

    @classmethod
    def fixed(cls, nodes: int) -> DynamicConfig:
        """The `nodes` best candidates verified every step (`drafters-generate --nodes`, the
        bench's `dynamic<n>` and `hybrid<n>`): the tree is shaped per step, its size is not."""
        if nodes < 0:
            raise ValueError(f"a fixed dynamic tree needs nodes >= 0, got {nodes}")
        return cls(max_nodes=max(cls.max_nodes, nodes), budget=nodes)


def _expand_best_first(
    tree: CandidateTree, probs: torch.Tensor, ids: torch.Tensor, source: str, limit: int,
    below: int = 0,
) -> list[int]:  # fmt: skip
    """Add up to `limit` nodes below node `below`, best first by score: probs, ids (D, w), row
    d the candidates one level deeper than row d - 1 and independent of the token taken there
    (heads; a Falcon block). Returns the nodes added, in order."""
    p, t = probs.tolist(), ids.tolist()
    depth, width = len(p), len(p[0])
    heap = [(-tree.child_score(below, p[0][r], source), 0, r, below) for r in range(width)]
    heapq.heapify(heap)
    added: list[int] = []
    while heap and len(added) < limit:
        _, d, r, parent = heapq.heappop(heap)
        node = tree.add(parent, t[d][r], p[d][r], source)
        added.append(node)
        if d + 1 < depth:
            for r2 in range(width):
                score = tree.child_score(node, p[d + 1][r2], source)
                heapq.heappush(heap, (-score, d + 1, r2, node))
    return added


def gate_conditionals(gate: nn.Module, f: torch.Tensor, logits: torch.Tensor,
                      top1: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """What a gate predicts for this step's top-1 chain, as P(depth i right | depths < i right),
    one per depth of `top1` (D,), the heads' own top-1 probabilities (their guess of the same).

    A `LearnedGate` gives P(heads 0..i all right) per head: its ratios, for the depths it has
    heads for (deeper: the heads' own). Any other gate gives E[a], the expected accepted length
    of the chain (`expected_accept`, e.g. the entropy gate's calibration table): the heads'
    conditionals are scaled by one factor r, found by bisection, so that the chain's expected
    length sum_i prod_{j<=i} min(1, r c_j) equals E[a] (capped at D)."""
    c = top1.float().clamp(min=1e-6)
    f, logits = f.reshape(1, -1), logits.reshape(1, -1)
    if isinstance(gate, LearnedGate):
        q = gate(f.to(gate.fc1.weight.dtype), logits).float().sigmoid().reshape(-1)
        q = q[: c.numel()]
        prev = torch.cat([q.new_ones(1), q[:-1]])
        out = c.clone()
        out[: q.numel()] = (q / prev.clamp(min=1e-6)).clamp(0.0, 1.0)
        return out
    e = min(float(gate.expected_accept(f, logits)), float(c.numel()))
    if e <= 0:
        return torch.zeros_like(c)

    def length(r: float) -> float:
        return float((r * c).clamp(max=1.0).cumprod(0).sum())

    lo, hi = 0.0, 1.0 / float(c.min())  # length(hi) = D
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if length(mid) < e else (lo, mid)
    return (hi * c).clamp(max=1.0)


class HeadProposer:
    """Medusa / Cerberus: head i's top tokens at the last committed position's feature; with a
    gate, each depth's probabilities are rescaled to the gate's view of this step
    (`gate_conditionals`)."""

    source = "heads"

    def __init__(self, drafter, target: Target, cfg: DynamicConfig, gate: nn.Module | None = None):
        from drafters.decoding.heads import draft_token_ids, head_logits

        self.drafter, self.target, self.cfg, self.gate = drafter, target, cfg, gate
        self.depth = getattr(drafter, "num_heads", None)  # None: every head it has
        self._logits, self._ids = head_logits, draft_token_ids(drafter)

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor,
                logits: torch.Tensor | None = None) -> None:  # fmt: skip
        self.f = features[:, -1:]  # (1, 1, d): the position whose heads guess past the root
        self.target_logits = logits  # (1, 1, V): the target's at that position (the gate's)

    def propose(self, tree: CandidateTree) -> None:
        logits = self._logits(self.drafter, self.f, self.target.lm_head, self.depth).float()
        top = logits.softmax(-1).topk(self.cfg.width, dim=-1)
        probs = top.values.reshape(-1, self.cfg.width)  # (D, w)
        if self.gate is not None:
            cond = gate_conditionals(self.gate, self.f, self.target_logits, probs[:, 0])
            probs = (probs * (cond / probs[:, 0].clamp(min=1e-6)).unsqueeze(-1)).clamp(max=1.0)
        ids = top.indices if self._ids is None else self._ids.to(top.indices.device)[top.indices]
        _expand_best_first(tree, probs, ids.reshape(probs.shape), self.source, self.cfg.max_nodes)

    def finish(self) -> None:
        pass


class FalconProposer:
    """Falcon: pass 1 over the committed sequence (always: it keeps the drafter's cache), then
    up to `passes - 1` further passes, each one drafter block of k positions per anchor, the
    `anchors` best nodes at the previous block's last depth (EAGLE-2's expand step), run while
    the best anchor's estimate is at least `min_anchor`."""

    source = "falcon"

    def __init__(self, drafter, target: Target, cfg: DynamicConfig):
        from drafters.decoding.falcon import DrafterContext

        self.drafter, self.target, self.cfg, self.k = drafter, target, cfg, drafter.cfg.k
        self.ctx = DrafterContext(drafter, target.embed_tokens)
        self.head = drafter.scoring_head(target.lm_head)
        self.vocab = getattr(drafter, "vocab", None)
        self.first: torch.Tensor | None = None

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor,
                logits: torch.Tensor | None = None) -> None:  # fmt: skip
        self.first = self.ctx.extend(features, next_tokens)  # pass 1: (1, k, d) or None

    def _top(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out (..., d) -> top probabilities and their target ids (..., width)."""
        top = project(self.head, out).float().softmax(-1).topk(self.cfg.width, dim=-1)
        return top.values, to_target(self.vocab, top.indices)

    def propose(self, tree: CandidateTree) -> None:
        if self.first is None:  # fewer than k positions fed: nothing to draft from yet
            return
        k, cfg = self.k, self.cfg
        probs, ids = self._top(self.first[0])  # (k, w): depths 1..k
        added = _expand_best_first(tree, probs, ids, self.source, cfg.max_nodes)
        outputs = {0: self.first[0]}  # anchor node -> the pass output that predicted below it
        earlier: list[int] = []  # anchors fed so far, in feeding order (passes >= 2)
        for b in range(1, cfg.passes):
            ends = [i for i in added if tree.nodes[i].depth == b * k]
            ends.sort(key=lambda i: -tree.nodes[i].score)
            anchors = ends[: cfg.anchors]
            if not anchors or tree.nodes[anchors[0]].score < cfg.min_anchor:
                break
            out = self._pass(tree, anchors, outputs, earlier, b)  # (E, k, d)
            probs, ids = self._top(out)  # (E, k, w)
            added = []
            for e, anchor in enumerate(anchors):
                added += _expand_best_first(tree, probs[e], ids[e], self.source, cfg.max_nodes,
                                            below=anchor)  # fmt: skip
                outputs[anchor] = out[e]
            earlier += anchors

    def _pass(self, tree: CandidateTree, anchors: list[int], outputs: dict, earlier: list[int],
              b: int) -> torch.Tensor:  # fmt: skip
        """One drafter block of k positions per anchor at depth bk, on top of the drafter's
        cache: position (b-1)k + q of an anchor's block reads its own block's output q (the
        pass that predicted the anchor's last k tokens) and the path token at depth
        (b-1)k + q + 1; it sees the committed context, the blocks of its anchor's ancestors
        and its own block both ways (as `draft_tree` does for a static plan)."""
        k, ctx = self.k, self.ctx
        device = self.first.device
        feats, toks = [], []
        for a in anchors:
            path = _path(tree, a)  # nodes at depths 1 .. bk
            block_anchor = path[(b - 1) * k - 1] if b > 1 else 0  # the anchor of a's block
            feats.append(outputs[block_anchor])
            toks.append([tree.nodes[i].token for i in path[(b - 1) * k :]])
        e = len(anchors)
        everyone = earlier + anchors
        sees = torch.tensor([[c in _path(tree, a) or c == a for c in everyone] for a in anchors],
                            device=device)  # fmt: skip
        attend = sees.repeat_interleave(k, 0).repeat_interleave(k, 1)  # (E*k, (C + E)*k)
        # the blocks of earlier passes are in the cache after the committed part
        past = ctx.cache.length
        bias = torch.cat([ctx.visible.expand(e * k, -1), attend], dim=1)
        positions = ctx.fed + (b - 1) * k + torch.arange(k, device=device).repeat(e)
        out = ctx.drafter(
            torch.stack(feats).reshape(1, e * k, -1),
            torch.tensor(toks, device=device).view(1, e * k),
            ctx.embed,
            position_ids=positions.view(1, -1),
            cache=ctx.cache,
            attn_bias=bias.view(1, 1, e * k, past + e * k),
        )
        return out.view(e, k, -1)

    def finish(self) -> None:
        self.ctx.truncate()


def _path(tree: CandidateTree, node: int) -> list[int]:
    """The nodes from depth 1 down to `node`."""
    out = []
    while node > 0:
        out.append(node)
        node = tree.nodes[node].parent
    return out[::-1]


def _explore(tree: CandidateTree, calib: Calibration, ar_run: int, cfg: DynamicConfig) -> bool:
    """Whether to verify the best node although the budget says 0: a source of it is still
    unseen at depth 1 (its estimates may be off either way), or it is time to look again."""
    best = tree.nodes[tree.best(1)[0]]
    unseen = any(calib.evidence(s, 1) < cfg.explore_min for s in best.cond)
    return unseen or ar_run + 1 >= cfg.explore_every


def proposer_for(drafter, target: Target, cfg: DynamicConfig, gate: nn.Module | None = None):
    """The candidate source for a drafter module (None: n-gram candidates only)."""
    from drafters.models.falcon import FalconDrafter

    if drafter is None or not cfg.drafter:
        if gate is not None:
            raise ValueError("a gate rescales a head drafter's candidates: there is none here")
        return None
    if isinstance(drafter, FalconDrafter):
        if gate is not None:
            raise ValueError("a Falcon drafter has no gate")
        return FalconProposer(drafter, target, cfg)
    return HeadProposer(drafter, target, cfg, gate)


@torch.inference_mode()
@fitted
def decode_dynamic(
    target: Target,
    drafter: nn.Module | None,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    cfg: DynamicConfig | None = None,
    cost: list[float] | None = None,
    stream: Callable[[list[int]], None] | None = None,
    gate: nn.Module | None = None,
) -> DecodeResult:
    """Greedy decoding of input_ids (1, T) with a tree built and sized each step; output
    identical to plain greedy. drafter: a head drafter or Falcon module, or None (n-gram
    candidates only). cost: t(n)/t(1) by rows n (`forward_cost_profile`), measured here (once
    per target and thread count) when not given; unused with a fixed `cfg.budget`. gate: a head
    drafter's entropy or learned gate, read each step to rescale the heads' estimates.
    `DecodeResult.step_nodes` holds the nodes each step verified."""
    cfg = cfg or DynamicConfig()
    if cfg.budget is None and cost is None:
        cost = cost_profile(target, cfg.max_nodes + 1)
    device = target.device
    input_ids = input_ids.to(device)
    gen = Generation(input_ids, max_new_tokens, target.eos_token_ids, stream)
    if gen.done:
        return gen.result()
    proposer = proposer_for(drafter, target, cfg, gate)
    index = NgramIndex(max(cfg.ngram, 1))
    calib = Calibration()
    cache = new_cache(target)
    aux = aux_layers_of(drafter)  # EAGLE-3's fused layers: f comes wide
    d = target.hidden_size
    f = target_forward(target, cache, input_ids, aux_layers=aux)  # (1, T, d)
    logits = project(target.lm_head, f[:, -1:, :d])  # (1, 1, V): the target's at the last position
    root = int(logits.argmax(-1))
    gen.emit([root])
    index.extend(input_ids[0].tolist() + [root])
    next_tokens = torch.cat([input_ids[:, 1:], input_ids.new_tensor([[root]])], dim=1)
    ar_run = 0  # AR steps in a row
    while not gen.done:
        tree = CandidateTree(root, calib)
        if proposer is not None:
            proposer.observe(f, next_tokens, logits)
            proposer.propose(tree)
            proposer.finish()
        if cfg.ngram:
            cont, n = index.lookup(cfg.ngram_tokens)
            if cont:
                tree.add_path(cont, [cfg.ngram_prior] * len(cont), f"ngram{n}")
        if cfg.budget is None:
            n = choose_budget(tree.scores_sorted(), cost, cfg.max_nodes)
            if n == 0 and len(tree) and _explore(tree, calib, ar_run, cfg):
                n = 1
        else:
            n = min(cfg.budget, len(tree))
        ar_run = ar_run + 1 if n == 0 else 0
        if n == 0:
            f = target_forward(target, cache, torch.tensor([[root]], device=device), aux_layers=aux)
            logits = project(target.lm_head, f[..., :d])
            root = int(logits.argmax(-1))
            new = [root]
            gen.step(new, drafted=0, tree=False)
        else:
            chosen = tree.best(n)
            tokens, layout, rows = tree.layout(chosen, device)
            v = verify_tree(target, cache, tokens, layout, aux)
            calib.update(tree, chosen, {rows[r] for r in v.path.tolist()})
            new = v.accepted + [v.bonus]
            gen.step(new, drafted=len(v.accepted), tree=True, nodes=n)
            f, root, logits = v.features, v.bonus, v.logits
        next_tokens = torch.tensor([new], device=device)
        index.extend(new)
    return gen.result()
