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

Aligned blocks at every N (docs/design.md section 4). In training a block of k positions starts
at a multiple of k and sees itself both ways and every earlier position; its slot q predicts
depth q + 1 after the block. At decoding time the last k committed positions N-k .. N-1 must be
such a block whatever N mod k = r, or depth 1 would come from a block that never saw the root
pair. So the drafter cache keeps whole aligned blocks only, positions 0 .. A-1 with
A = k * floor(N/k) (exact: a block never sees later blocks), and pass 1 is:
- r = 0: the newly completed blocks fed on the cache; the last of them is N-k .. N-1.
- r > 0: the newly completed blocks, then the *realigned block* N-k .. N-1 (the last k committed
  pairs, k extra drafter positions) on top of the cache, seeing cached positions < N-k only and
  itself both ways. Cached positions N-k .. A-1 stay hidden from it and from the tree passes
  (`DrafterContext.visible`); the tree blocks then start at N with the training structure. What
  still differs from training at r > 0: the cached positions A-k .. N-k-1 were computed with
  their aligned block, which reaches into the realigned one (true pairs either way).
A test checks pass 1 against one forward over [0 .. A-1 ; N-k .. N-1] with that mask, and that
the depth-1 draft depends on the root pair at every r for k = 2, 3, 4. Each step then feeds the
root and the accepted nodes once into the aligned cache, plus k realigned positions when r > 0.

Where drafting still departs from training (it changes what is drafted, never the output):
- r > 0: the cached positions of the aligned block around N-k, see above.
- LSTM fusion: the realigned block restarts the recurrence from the exact state after N-k-1; a
  tree block restarts it from the state after N-1 and ignores its ancestor blocks (it still
  sees them through attention), see `FalconDrafter._fuse`.

Draft vocabulary (docs/design.md section 10): the drafter ranks only its V_d ids; the nodes carry
the target ids they stand for, and the target verifies them with its full head, so a token
outside the draft vocabulary is never drafted but is still emitted (as a bonus token).

A prompt shorter than k gives fewer than k outputs: that step verifies the root alone (an AR
step, counted in `ar_steps`); every later step has N >= k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from drafters.decoding.cache import new_cache, target_forward
from drafters.decoding.falcon_tree import FalconPlan, get_falcon_tree
from drafters.decoding.linears import fitted, project
from drafters.decoding.result import DecodeResult, Generation
from drafters.decoding.tree import Tree, TreeLayout
from drafters.decoding.verify import verify_tree
from drafters.models import aux_layers_of
from drafters.models.falcon import FalconDrafter
from drafters.models.vocab import to_target
from drafters.target import Target


class DrafterContext:
    """The drafter's KV cache over the committed sequence, fed incrementally (pass 1).

    Invariant between steps: the cache holds the whole aligned blocks of k, positions
    0 .. `cached` - 1, `cached` = k * floor(fed / k); `pending` holds the inputs of positions
    `cached` .. `fed` - 1 (the incomplete block), fed with the next ones; `window` the inputs
    of the last 2k fed positions. After `extend` the cache may also hold the realigned block,
    and `visible` (cache.length,) says which cache entries the tree passes attend to.
    """

    def __init__(self, drafter: FalconDrafter, embed: nn.Embedding):
        self.drafter, self.embed, self.k = drafter, embed, drafter.cfg.k
        self.lstm = drafter.cfg.fusion == "lstm"
        self.cache = drafter.new_cache()
        self.cached = self.fed = 0
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (1, P, d), (1, P)
        self.window: tuple[torch.Tensor, torch.Tensor] | None = None  # (1, <= 2k, d), (1, .)
        self.visible: torch.Tensor | None = None  # (cache.length,) bool, set by `extend`
        self._lstm_aligned = None  # (state, length) at `cached`, restored by `truncate`
        self._lstm_last_block = None  # LSTM state after position cached - k - 1

    def extend(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor | None:
        """Feed new positions: features (1, n, d) true f_j, next_tokens (1, n) t_{j+1}.

        Returns the outputs of the block N-k .. N-1 (1, k, d), N = `fed` after the call:
        guesses of f_N .. f_{N+k-1}, i.e. depths 1..k below the root t_N. None while fewer than
        k positions were fed. The tree passes go on top; `truncate` cuts the cache back.
        """
        self.window = _append(self.window, features, next_tokens, 2 * self.k)
        if self.pending is not None:
            features, next_tokens = _append(self.pending, features, next_tokens)
        start, end = self.cached, self.cached + features.shape[1]  # positions start .. end-1
        whole = end // self.k * self.k - start  # inputs that complete blocks, kept cached
        out = self._feed_blocks(features[:, :whole], next_tokens[:, :whole]) if whole else None
        self.pending = (features[:, whole:], next_tokens[:, whole:])
        self.cached, self.fed = start + whole, end
        self.visible = torch.ones(self.cached, dtype=torch.bool, device=features.device)
        if end < self.k:
            return None
        if end == self.cached:  # r = 0: the last block fed is N-k .. N-1
            return out[:, -self.k :]
        return self._realigned_block()

    def _feed_blocks(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Chain forward of whole blocks on the cache (default position ids, block-causal)."""
        k, n = self.k, features.shape[1]
        if not self.lstm:
            return self.drafter(features, next_tokens, self.embed, cache=self.cache)
        # LSTM: the state before the last block is kept for the realigned block's recurrence
        outs = []
        if n > k:
            outs.append(self.drafter(features[:, :-k], next_tokens[:, :-k], self.embed,
                                     cache=self.cache))  # fmt: skip
        self._lstm_last_block = self.cache.lstm_state
        outs.append(self.drafter(features[:, -k:], next_tokens[:, -k:], self.embed,
                                 cache=self.cache))  # fmt: skip
        self._lstm_aligned = (self.cache.lstm_state, self.cache.lstm_length)
        return torch.cat(outs, dim=1)

    def _realigned_block(self) -> torch.Tensor:
        """r = N mod k > 0: positions N-k .. N-1 as one block over cached positions < N-k."""
        k, N = self.k, self.fed
        f, t = self.window[0][:, -k:], self.window[1][:, -k:]
        length = self.cache.length
        device = f.device
        seen = torch.arange(length, device=device) < N - k
        bias = torch.cat([seen.expand(k, length), seen.new_ones(k, k)], dim=1)
        if self.lstm:  # the recurrence over 0 .. N-k-1, then over the block itself
            r = N % k
            head = (self.window[0][:, -k - r : -k], self.window[1][:, -k - r : -k])
            self.cache.lstm_state = self.drafter.fusion_state(*head, self.embed,
                                                             self._lstm_last_block)  # fmt: skip
            after = self.drafter.fusion_state(f, t, self.embed, self.cache.lstm_state)
        out = self.drafter(
            f,
            t,
            self.embed,
            position_ids=torch.arange(N - k, N, device=device).view(1, k),
            cache=self.cache,
            attn_bias=bias.view(1, 1, k, length + k),
        )
        if self.lstm:
            self.cache.lstm_state = after  # tree blocks restart from the state after N-1
        self.visible = torch.cat([seen, seen.new_ones(k)])
        return out

    def truncate(self) -> None:
        """Cut the cache back to the whole blocks of the committed sequence (drops the realigned
        block and the tree entries); LSTM: its recurrent state back to that length."""
        self.cache.crop(self.cached)
        if self._lstm_aligned is not None:
            self.cache.lstm_state, self.cache.lstm_length = self._lstm_aligned


def _append(
    old: tuple[torch.Tensor, torch.Tensor] | None,
    features: torch.Tensor,
    next_tokens: torch.Tensor,
    keep: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """old inputs + new ones along time, the last `keep` positions only when given."""
    if old is not None:
        features = torch.cat([old[0], features], dim=1)
        next_tokens = torch.cat([old[1], next_tokens], dim=1)
    if keep is not None:
        features, next_tokens = features[:, -keep:], next_tokens[:, -keep:]
    return features, next_tokens


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
            past = ctx.cache.length  # committed (ctx.visible) + earlier tree passes
            bias = torch.cat(
                [ctx.visible.expand(e * k, -1), block.attend], dim=1
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
@fitted
def decode_falcon(
    target: Target,
    drafter: FalconDrafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    tree: Tree | str | Sequence[Sequence[int]] = "kmask2_8layer_tree",
    stream: Callable[[list[int]], None] | None = None,
) -> DecodeResult:
    """Greedy Falcon tree decoding of input_ids (1, T); output identical to plain greedy.

    tree: a Falcon tree spec (`get_falcon_tree`: preset name, `chain`, `chain<D>`, list of
    paths), read in blocks of drafter.cfg.k. `tree_steps` counts verification forwards.
    stream: called with the tokens of each step as they are accepted.
    """
    k = drafter.cfg.k
    tree = get_falcon_tree(tree, k)
    device = target.device
    plan = FalconPlan.from_tree(tree, k).to(device)
    layout = tree.layout.to(device)
    root_only = TreeLayout.from_parents([-1]).to(device)
    input_ids = input_ids.to(device)
    gen = Generation(input_ids, max_new_tokens, target.eos_token_ids, stream)
    if gen.done:
        return gen.result()
    cache = new_cache(target)
    aux = aux_layers_of(drafter)  # EAGLE-3's fused features: f comes wide
    f = target_forward(target, cache, input_ids, aux_layers=aux)  # (1, T, d) every prompt position
    root = int(project(target.lm_head, f[:, -1:, : target.hidden_size]).argmax(-1))
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
        v = verify_tree(target, cache, tokens, step_layout, aux)
        gen.step(v.accepted + [v.bonus], drafted=len(v.accepted), tree=first is not None,
                 nodes=len(tokens) - 1)  # fmt: skip
        f = v.features  # (1, a + 1, d) at the root and the accepted nodes
        next_tokens = torch.tensor([v.accepted + [v.bonus]], device=device)
        root = v.bonus
    return gen.result()
