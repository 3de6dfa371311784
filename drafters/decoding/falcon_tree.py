"""Falcon's custom-designed tree (docs/design.md section 5): the tree spec, its presets, a builder,
and `FalconPlan`, what each drafter pass of a decoding step feeds and fills.

A Falcon tree is a list of rank paths, exactly like a static tree (`Tree`, so it is plain
JSON-able data), but read in blocks of k depths, because the drafter predicts k tokens a forward.
Element d - 1 of a path (depth d) is a rank into the top list of the drafter's prediction for
depth d, and that prediction comes from block b = (d - 1) // k:

- block 0 (depths 1..k): the last k outputs of pass 1, the drafter's forward over the committed
  sequence. All of block 0 shares them: with k = 2 the path (a, c) is "rank a of depth 1, rank
  c of depth 2" of the same forward, so depth 2's list does not depend on a.
- block b >= 1 (depths bk+1 .. bk+k): pass b + 1 runs one block of k drafter positions per
  *anchor*, a node at depth bk with descendants in the tree. The block reads the anchor's last
  k path tokens (depths (b-1)k+1 .. bk) with the k output features of the anchor's own block
  (pass b), and its k outputs rank depths bk+1 .. bk+k below that anchor only.

So the tree fixes the drafter's work as well as the verification size: pass b + 1 feeds
k * (anchors at depth bk) positions. A tree of depth D runs ceil(D / k) passes.

Presets (`FALCON_PRESETS`; any list of paths works, e.g. from an exported checkpoint's config):
- `kmask2_8layer_tree`: the released tree for k = 2 (Bestpay-inc/Falcon, models/choices.py,
  commit 1fe360e), depth 8 = 4 passes, top-20 at depth 1. The released list has 166 entries
  with one duplicate ([0, 1, 0, 0]); without it, 165 nodes, 20/15/19/23/21/23/21/23 per depth
  (the "24" at depth 4 counts the duplicate).
- `falcon_k2_32`: not Falcon's; 32 nodes, depth 8 for k = 2, built by `build_falcon_tree` from
  the profile of `SMALL_PROFILE` (see there), for machines where verification is not free.
- `chain` (4 passes of top-1, depth 4k) and `chain<D>` (depth D): one path of top-1 tokens.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from drafters.decoding.tree import Path, Tree, chain

# Released Falcon tree (k = 2, depth 8), in its own order, its duplicate [0, 1, 0, 0] dropped.
KMASK2_8LAYER_TREE: list[list[int]] = [
    [0], [1], [2], [3], [4], [5], [6], [7], [8], [9], [10], [11], [12], [13], [14], [15], [16],
    [17], [18], [19],
    [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [0, 8], [0, 9], [1, 0],
    [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7],
    [0, 0, 8], [0, 0, 9], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [0, 3, 0], [1, 0, 0],
    [1, 0, 1], [2, 0, 0], [3, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 0, 5],
    [0, 0, 0, 6], [0, 0, 0, 7], [0, 0, 0, 8], [0, 0, 0, 9], [0, 0, 1, 0], [0, 0, 1, 1],
    [0, 0, 2, 0], [0, 1, 0, 0], [0, 1, 0, 1], [0, 1, 1, 0], [0, 2, 0, 0], [0, 2, 1, 0],
    [0, 3, 0, 0], [1, 0, 0, 0], [1, 0, 0, 1], [2, 0, 0, 0], [3, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 0, 3], [0, 0, 0, 0, 4],
    [0, 0, 0, 0, 5], [0, 0, 0, 0, 6], [0, 0, 0, 0, 7], [0, 0, 0, 0, 8], [0, 0, 0, 0, 9],
    [0, 0, 0, 1, 0], [0, 0, 0, 1, 1], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0],
    [0, 1, 0, 0, 0], [0, 2, 0, 0, 0], [0, 3, 0, 0, 0], [1, 0, 0, 0, 0], [2, 0, 0, 0, 0],
    [3, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 2], [0, 0, 0, 0, 0, 3],
    [0, 0, 0, 0, 0, 4], [0, 0, 0, 0, 0, 5], [0, 0, 0, 0, 0, 6], [0, 0, 0, 0, 0, 7],
    [0, 0, 0, 0, 0, 8], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 2, 0],
    [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 2, 0, 0], [0, 0, 1, 0, 0, 0],
    [0, 0, 2, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0],
    [1, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 2], [0, 0, 0, 0, 0, 0, 3],
    [0, 0, 0, 0, 0, 0, 4], [0, 0, 0, 0, 0, 0, 5], [0, 0, 0, 0, 0, 0, 6], [0, 0, 0, 0, 0, 0, 7],
    [0, 0, 0, 0, 0, 0, 8], [0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 2, 0],
    [0, 0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0], [0, 0, 2, 0, 0, 0, 0],
    [0, 1, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0],
    [2, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 2],
    [0, 0, 0, 0, 0, 0, 0, 3], [0, 0, 0, 0, 0, 0, 0, 4], [0, 0, 0, 0, 0, 0, 0, 5],
    [0, 0, 0, 0, 0, 0, 0, 6], [0, 0, 0, 0, 0, 0, 0, 7], [0, 0, 0, 0, 0, 0, 1, 0],
    [0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 2, 0], [0, 0, 0, 0, 0, 1, 0, 0],
    [0, 0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 2, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 2, 0, 0, 0, 0, 0],
    [0, 1, 0, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0, 0, 0], [0, 3, 0, 0, 0, 0, 0, 0],
    [1, 0, 0, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0, 0],
]  # fmt: skip

# Assumed (not measured) accuracies behind `falcon_k2_32`: SMALL_PROFILE[d][r] = P(rank r is
# right at depth d + 1 | its path is right), top-1 falling from 0.8 by 0.05 a depth, rank r
# worth 0.25^r of rank 0. Replace by measured accuracies with `build_falcon_tree`.
SMALL_PROFILE: list[list[float]] = [
    [(0.8 - 0.05 * d) * 0.25**r for r in range(8)] for d in range(8)
]
SMALL_MAX_ANCHORS = 3

# build_falcon_tree(SMALL_PROFILE, 32, k=2, max_anchors=SMALL_MAX_ANCHORS), written out (a test
# checks it): depth 8, 3/6/7/5/4/5/1/1 nodes per depth, passes 2-4 feed 6/6/2 positions.
FALCON_K2_32: list[list[int]] = [
    [0], [1], [2], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [0, 0, 0], [0, 0, 1],
    [0, 0, 2], [0, 1, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1],
    [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0],
    [0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0],
    [0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0],
]  # fmt: skip

FALCON_PRESETS: dict[str, list[list[int]]] = {
    "kmask2_8layer_tree": KMASK2_8LAYER_TREE,
    "falcon_k2_32": FALCON_K2_32,
}

PAPER_PASSES = 4  # m: drafter passes of the paper's trees (depth 8 for k = 2)


def get_falcon_tree(spec: str | Sequence[Sequence[int]] | Tree, k: int) -> Tree:
    """A Falcon tree from config: a preset name, `chain` (depth 4k), `chain<D>`, or paths."""
    if isinstance(spec, Tree):
        return spec
    if isinstance(spec, str):
        if spec == "chain":
            return chain(PAPER_PASSES * k)
        if m := re.fullmatch(r"chain_?(\d+)", spec):
            return chain(int(m.group(1)))
        if spec not in FALCON_PRESETS:
            raise ValueError(
                f"unknown Falcon tree {spec!r}: use chain, chain<D>, a list of paths or one of "
                f"{sorted(FALCON_PRESETS)}"
            )
        return Tree.from_list(FALCON_PRESETS[spec])
    return Tree.from_list(spec)


def build_falcon_tree(
    topk_acc: torch.Tensor | Sequence[Sequence[float]],
    num_nodes: int,
    k: int,
    max_anchors: int | None = None,
) -> Tree:
    """Greedy Falcon tree from per-depth top-k accuracies (D, topk): topk_acc[d, r] = P(the
    rank-r token at depth d + 1 is right | its path is right), e.g. validation accuracy per
    offset, pass 1 offsets teacher-forced and later ones on the drafter's own inputs.

    As `build_tree`: a node's score is the product of its path's accuracies, and the best
    node whose parent is in the tree is added, num_nodes times (ties: shorter, then smaller
    path). max_anchors caps the anchors per pass >= 2 (the drafter's cost: k positions each):
    a node that would need a new anchor in a full pass is skipped, with its subtree.
    """
    acc = torch.as_tensor(topk_acc, dtype=torch.float64).tolist()
    depth, topk = len(acc), len(acc[0])
    frontier = [(-acc[0][r], 1, (r,)) for r in range(topk)]  # (-score, depth, path)
    heapq.heapify(frontier)
    paths: list[Path] = []
    anchors: dict[int, set[Path]] = {}  # block b >= 1 -> its anchors (paths of length bk)
    while frontier and len(paths) < num_nodes:
        neg, d, path = heapq.heappop(frontier)
        b = (d - 1) // k
        if b and max_anchors is not None:
            block = anchors.setdefault(b, set())
            if path[: b * k] not in block:
                if len(block) >= max_anchors:
                    continue
                block.add(path[: b * k])
        paths.append(path)
        if d < depth:
            for r in range(topk):
                heapq.heappush(frontier, (neg * acc[d][r], d + 1, path + (r,)))
    return Tree(tuple(paths))


@dataclass(frozen=True, eq=False)
class Block:
    """Depths bk+1 .. bk+k of a tree: the drafter pass that predicts them and where they go.

    Node indices are those of `tree.layout` (0 = root). E = anchors, one drafter block of k
    positions each (block 0: the root alone, whose "pass" is pass 1's last k outputs).
    """

    anchors: torch.Tensor  # (E,) anchor node per drafter block of this pass
    source: torch.Tensor  # (E,) slot of each anchor's own anchor in the previous Block
    feed: torch.Tensor  # (E, k) nodes whose tokens the pass reads: the anchor's last k
    attend: torch.Tensor  # (E*k, C + E*k) bool tree part of the mask, C = k * earlier anchors
    nodes: torch.Tensor  # (n_b,) the tree nodes of these depths
    slot: torch.Tensor  # (n_b,) which anchor's pass predicts each node
    offset: torch.Tensor  # (n_b,) which of that pass's k outputs: depth - 1 - bk
    rank: torch.Tensor  # (n_b,) rank into that output's top list
    width: int  # top list length the block needs: 1 + max rank

    def to(self, device: torch.device | str) -> Block:
        moved = {
            name: getattr(self, name).to(device)
            for name in ("anchors", "source", "feed", "attend", "nodes", "slot", "offset", "rank")
        }
        return Block(**moved, width=self.width)


@dataclass(frozen=True, eq=False)
class FalconPlan:
    """A Falcon tree read in blocks of k: what every drafter pass of a step feeds and fills."""

    tree: Tree
    k: int
    blocks: tuple[Block, ...]  # block b predicts depths bk+1 .. bk+k; len = ceil(depth / k)

    @classmethod
    def from_tree(cls, tree: Tree, k: int) -> FalconPlan:
        index: dict[Path, int] = {p: i + 1 for i, p in enumerate(tree.paths)}
        index[()] = 0
        ancestors = tree.layout.ancestors  # (n, n)
        blocks: list[Block] = []
        prev_slot: dict[Path, int] = {}
        earlier: list[int] = []  # anchors of passes >= 2 so far, in feeding order
        for b in range(math.ceil(tree.depth / k)):
            members = [p for p in tree.paths if b * k < len(p) <= (b + 1) * k]
            anchors = sorted({p[: b * k] for p in members}, key=index.__getitem__)
            slot = {a: i for i, a in enumerate(anchors)}
            anchor_ids = [index[a] for a in anchors]
            if b == 0:
                source = torch.zeros(1, dtype=torch.long)
                feed = torch.zeros(1, 0, dtype=torch.long)
                attend = torch.zeros(0, 0, dtype=torch.bool)
            else:
                source = torch.tensor([prev_slot[a[: (b - 1) * k]] for a in anchors])
                feed = torch.tensor(
                    [[index[a[:j]] for j in range((b - 1) * k + 1, b * k + 1)] for a in anchors]
                )
                earlier += anchor_ids
                sees = ancestors[anchor_ids][:, earlier]  # (E, C/k + E) anchor is or is below
                attend = sees.repeat_interleave(k, 0).repeat_interleave(k, 1)
            blocks.append(
                Block(
                    anchors=torch.tensor(anchor_ids),
                    source=source,
                    feed=feed,
                    attend=attend,
                    nodes=torch.tensor([index[p] for p in members]),
                    slot=torch.tensor([slot[p[: b * k]] for p in members]),
                    offset=torch.tensor([len(p) - 1 - b * k for p in members]),
                    rank=torch.tensor([p[-1] for p in members]),
                    width=1 + max(p[-1] for p in members),
                )
            )
            prev_slot = slot
        return cls(tree, k, tuple(blocks))

    def to(self, device: torch.device | str) -> FalconPlan:
        return FalconPlan(self.tree, self.k, tuple(b.to(device) for b in self.blocks))

    @property
    def passes(self) -> int:
        """Drafter passes per step: pass 1 over the committed sequence, then one per block."""
        return len(self.blocks)

    def drafter_positions(self) -> list[int]:
        """Positions fed by passes 2.. (k per anchor): the tree's drafting cost."""
        return [self.k * b.anchors.numel() for b in self.blocks[1:]]
