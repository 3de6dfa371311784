"""Falcon decoding (docs/design.md sections 4-5): the drafter's custom-designed tree, verified
by the target in one forward; greedy, batch 1, lossless for any drafter weights.

Alignment. Drafter position j reads (f_j, t_{j+1}) and outputs a guess of f_{j+k}, whose LM-head
argmax guesses t_{j+k+1}. With committed tokens t_0 .. t_N (t_N the root: emitted, not yet in
the target's cache) the target has given f_0 .. f_{N-1}, so positions 0 .. N-1 are feedable
(after the prefill: every prompt position, the last one paired with the prefill's token). The
last k outputs, at N-k .. N-1, guess f_N .. f_{N+k-1}, i.e. the tokens t_{N+1} .. t_{N+k} at
depths 1..k below the root.

One step:
  pass 1: feed the positions that became feedable (`DrafterContext.extend`): the root and the
    accepted nodes of the last verification with their target features, paired with their next
    tokens (the next accepted one, the bonus for the last). Its last k outputs give block 0.
  pass b + 1 (b >= 1): one block of k positions per anchor of block b (`FalconPlan`): position
    N + (b-1)k + q reads (the anchor pass's output q, the anchor's path token at depth
    (b-1)k + q + 1); it sees the committed cache, its own block (both ways, as in training) and
    its ancestors' blocks. Blocks of one pass run as one batched forward on the drafter cache.
  verify: the tree's nodes (root + `tree.paths` order) in one target forward (`verify_tree`).
  Then the drafter cache drops the tree entries (`DrafterContext.truncate`).

Exactness of pass 1. The drafter attends bidirectionally inside aligned blocks of k positions
(position id // k), so a position already cached whose block was incomplete would have seen the
rest of its block in a full forward. The cache therefore keeps whole blocks only: after a step
it holds positions 0 .. k*floor(N/k) - 1, and the < k positions of the incomplete block are fed
again with the next ones (at most k - 1 extra positions a step, never the whole prefix). Pass 1
then equals the drafter's full forward over the committed sequence (a test checks it, LSTM
fusion included: its recurrent state is kept at the cached length).

Where drafting departs from training (it changes what is drafted, never the output):
- N not a multiple of k (r = N mod k > 0): block 0 mixes outputs of the last whole block
  (depths 1..k-r, which do not see the last r committed pairs) and of the incomplete block
  (depths k-r+1..k, whose positions in training would also see the rest of their block), and
  tree blocks start at N, not at a multiple of k. With r = 0 every drafter position sees what
  it saw in training. (The released code aligns blocks on each fed chunk instead, which makes
  its cache inexact.) A training-aligned variant would put tree blocks on multiples of k, make
  block 0 only k - r deep and re-feed the r tail pairs in each pass-2 block.
- LSTM fusion: a tree block restarts the recurrence from the state after position N - 1 and
  ignores its ancestor blocks (it still sees them through attention), see `FalconDrafter._fuse`.

Draft vocabulary (docs/design.md section 10): the drafter ranks only its V_d ids; the nodes carry
the target ids they stand for, and the target verifies them with its full head, so a token
outside the draft vocabulary is never drafted but is still emitted (as a bonus token).

A prompt shorter than k gives fewer than k outputs: that step verifies the root alone (an AR
step, counted in `ar_steps`); every later step has N >= k.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from drafters.decoding.cache import new_cache, target_forward
from drafters.decoding.falcon_tree import FalconPlan, get_falcon_tree
from drafters.decoding.logits import project
from drafters.decoding.result import DecodeResult, Generation
from drafters.decoding.tree import Tree, TreeLayout
from drafters.decoding.verify import verify_tree
from drafters.models.falcon import FalconDrafter
from drafters.models.vocab import to_target
from drafters.target import Target


class DrafterContext:
    """The drafter's KV cache over the committed sequence, fed incrementally (pass 1).

    Invariant between steps: the cache holds the whole blocks of k, positions 0 .. `cached` - 1,
    `cached` = k * floor(fed / k); `pending` holds the inputs of positions `cached` .. `fed` - 1
    (the incomplete block), fed again by the next `extend`; `recent` holds the outputs of up to
    k positions before `cached` (they never change: a block does not see later blocks).
    """

    def __init__(self, drafter: FalconDrafter, embed: nn.Embedding):
        self.drafter, self.embed, self.k = drafter, embed, drafter.cfg.k
        self.lstm = drafter.cfg.fusion == "lstm"
        self.cache = drafter.new_cache()
        self.cached = self.fed = 0
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (1, P, d), (1, P)
        self.recent: torch.Tensor | None = None  # (1, <= k, d)
        self._lstm_saved = None  # (state, length) at `cached`, while the cache runs past it

    def extend(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor | None:
        """Feed new positions: features (1, n, d) true f_j, next_tokens (1, n) t_{j+1}.

        Returns the outputs at positions fed-k .. fed-1 (1, k, d): guesses of the features of
        the k positions after the last fed one. None while fewer than k positions were fed.
        The cache then runs to `fed`; the tree passes go on top; `truncate` cuts it back.
        """
        if self.pending is not None:
            features = torch.cat([self.pending[0], features], dim=1)
            next_tokens = torch.cat([self.pending[1], next_tokens], dim=1)
        start, end = self.cached, self.cached + features.shape[1]  # positions start .. end-1
        whole = end // self.k * self.k - start  # inputs that complete blocks, to keep cached
        tail = features.shape[1] - whole  # the incomplete block, < k inputs
        outs = [] if self.recent is None else [self.recent]
        if self.lstm and tail:
            # the recurrent state at the block boundary is needed by `truncate`: two forwards
            if whole:
                outs.append(self._chain(features[:, :whole], next_tokens[:, :whole]))
            self._lstm_saved = (self.cache.lstm_state, self.cache.lstm_length)
            outs.append(self._chain(features[:, whole:], next_tokens[:, whole:]))
        else:
            outs.append(self._chain(features, next_tokens))
        out = torch.cat(outs, dim=1)  # (1, L, d): positions end - L .. end - 1
        self.recent = out[:, : out.shape[1] - tail][:, -self.k :]
        self.pending = (features[:, whole:], next_tokens[:, whole:])
        self.cached, self.fed = start + whole, end
        return out[:, -self.k :] if end >= self.k else None

    def _chain(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        # default position ids (cache length + i) and the block-causal mask on them
        return self.drafter(features, next_tokens, self.embed, cache=self.cache)

    def truncate(self) -> None:
        """Cut the cache back to the whole blocks of the committed sequence (drops the tree
        entries and the incomplete block); LSTM: its recurrent state back to that length."""
        self.cache.crop(self.cached)
        if self._lstm_saved is not None:
            self.cache.lstm_state, self.cache.lstm_length = self._lstm_saved
            self._lstm_saved = None


def draft_tree(
    plan: FalconPlan, ctx: DrafterContext, first: torch.Tensor, root: int, lm_head: nn.Linear
) -> torch.Tensor:
    """Passes 2.. on top of ctx's cache (which they grow); returns node tokens (n,), root first,
    in `plan.tree.layout` order. first: (1, k, d) pass 1's last k outputs. lm_head: the
    drafter's scoring head (`FalconDrafter.scoring_head`: with a draft vocabulary its V_d rows,
    whose top indices are mapped back to target ids)."""
    vocab = getattr(ctx.drafter, "vocab", None)
    k, n = plan.k, len(plan.tree) + 1
    device = first.device
    tokens = torch.empty(n, dtype=torch.long, device=device)
    tokens[0] = root
    out = first  # (E, k, d): the outputs of the previous pass, one row per anchor
    for b, block in enumerate(plan.blocks):
        if b:  # pass b + 1: one block of k positions per anchor
            e = block.anchors.numel()
            past = ctx.cache.length  # committed (ctx.fed) + earlier tree passes
            bias = torch.cat(
                [block.attend.new_ones(e * k, ctx.fed), block.attend], dim=1
            )  # (E*k, past + E*k) bool, True = attend
            positions = ctx.fed + (b - 1) * k + torch.arange(k, device=device).repeat(e)
            out = ctx.drafter(
                out[block.source].reshape(1, e * k, -1),  # the anchors' pass outputs
                tokens[block.feed].view(1, e * k),  # the anchors' last k path tokens
                ctx.embed,
                position_ids=positions.view(1, -1),
                cache=ctx.cache,
                attn_bias=bias.view(1, 1, e * k, past + e * k),
            ).view(e, k, -1)
        logits = project(lm_head, out)  # (E, k, V or V_d)
        top = logits.topk(block.width, dim=-1).indices  # (E, k, width)
        tokens[block.nodes] = to_target(vocab, top[block.slot, block.offset, block.rank])
    return tokens


@torch.inference_mode()
def decode_falcon(
    target: Target,
    drafter: FalconDrafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    tree: Tree | str | Sequence[Sequence[int]] = "kmask2_8layer_tree",
) -> DecodeResult:
    """Greedy Falcon tree decoding of input_ids (1, T); output identical to plain greedy.

    tree: a Falcon tree spec (`get_falcon_tree`: preset name, `chain`, `chain<D>`, list of
    paths), read in blocks of drafter.cfg.k. `tree_steps` counts verification forwards.
    """
    k = drafter.cfg.k
    tree = get_falcon_tree(tree, k)
    device = target.device
    plan = FalconPlan.from_tree(tree, k).to(device)
    layout = tree.layout.to(device)
    root_only = TreeLayout.from_parents([-1]).to(device)
    input_ids = input_ids.to(device)
    gen = Generation(input_ids, max_new_tokens, target.eos_token_ids)
    if gen.done:
        return gen.result()
    cache = new_cache(target)
    f = target_forward(target, cache, input_ids)  # (1, T, d) every prompt position
    root = int(project(target.lm_head, f[:, -1:]).argmax(-1))
    gen.emit([root])
    ctx = DrafterContext(drafter, target.embed_tokens)
    head = drafter.scoring_head(target.lm_head)  # V_d rows with a draft vocabulary
    next_tokens = torch.cat([input_ids[:, 1:], input_ids.new_tensor([[root]])], dim=1)
    while not gen.done:
        first = ctx.extend(f, next_tokens)  # pass 1
        if first is None:
            tokens, step_layout = torch.tensor([root], device=device), root_only
        else:
            tokens, step_layout = draft_tree(plan, ctx, first, root, head), layout
        ctx.truncate()
        v = verify_tree(target, cache, tokens, step_layout)
        gen.step(v.accepted + [v.bonus], drafted=len(v.accepted), tree=first is not None)
        f = v.features  # (1, a + 1, d) at the root and the accepted nodes
        next_tokens = torch.tensor([v.accepted + [v.bonus]], device=device)
        root = v.bonus
    return gen.result()
