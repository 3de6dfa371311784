"""Draft trees: the static Medusa-style tree (a list of paths) and the layout verification needs.

A static tree is a list of paths; element i of a path is a rank into head i's top-k, so the path
(0, 2) is "head 0's best token, then head 1's third best". Every prefix of a path must be a path
too. Node 0 is the root: the target's own next token (the previous step's bonus token), which is
not in the KV cache yet. Draft nodes follow in (depth, path) order, so a parent always precedes
its children; `verify.py` relies on that order.

`TreeLayout` is all verification needs and says nothing about ranks, so a tree built afresh each
step (Falcon) is just a `TreeLayout.from_parents(parents)`.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

Path = tuple[int, ...]

# Medusa's tree for Vicuna-7B: 63 nodes, depth 4. Copied from FasterDecoding/Medusa,
# medusa/model/medusa_choices.py (commit 11af0aa), in Medusa's order (greedy by estimated
# acceptance), so any prefix of it that is closed under parents is itself a sensible tree.
MC_SIM_7B_63: list[list[int]] = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0],
    [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0],
    [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4],
    [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8],
    [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0],
    [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0],
]  # fmt: skip

PRESETS: dict[str, list[list[int]]] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    # Not Medusa's: the first 16 entries of its tree (closed under parents), depth 3, for
    # machines where a verify forward is not free (CPU, small targets).
    "mc_sim_7b_63_first16": MC_SIM_7B_63[:16],
}


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """Shape of a tree of n nodes (root included), in topological order: parents[i] < i.

    parents: (n,) long, parents[0] = -1 (the root).
    depth: (n,) long, depth[0] = 0; a node's position id is past_len + depth.
    ancestors: (n, n) bool, ancestors[i, j] iff j is i or an ancestor of i (root included): the
        tree part of the attention mask, and "node i accepted iff all its ancestors match".
    """

    parents: torch.Tensor
    depth: torch.Tensor
    ancestors: torch.Tensor

    @classmethod
    def from_parents(cls, parents: Sequence[int] | torch.Tensor) -> TreeLayout:
        parents = torch.as_tensor(parents, dtype=torch.long).cpu()
        n = parents.numel()
        if n == 0 or parents[0] != -1:
            raise ValueError("node 0 must be the root (parents[0] == -1)")
        if not bool((parents[1:] >= 0).all() and (parents[1:] < torch.arange(1, n)).all()):
            raise ValueError("nodes must be in topological order: 0 <= parents[i] < i for i >= 1")
        depth = torch.zeros(n, dtype=torch.long)
        ancestors = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            p = int(parents[i])
            depth[i] = depth[p] + 1
            ancestors[i] |= ancestors[p]
        return cls(parents, depth, ancestors)

    def __len__(self) -> int:
        return self.parents.numel()

    def to(self, device: torch.device | str) -> TreeLayout:
        return TreeLayout(self.parents.to(device), self.depth.to(device), self.ancestors.to(device))


@dataclass(frozen=True)
class Tree:
    """A static tree: draft nodes given by paths of per-depth ranks (root excluded)."""

    paths: tuple[Path, ...]

    def __post_init__(self):
        unique = {tuple(int(r) for r in p) for p in self.paths}
        if len(unique) != len(self.paths) or not unique:
            raise ValueError("a tree lists every path once, and at least one")
        for p in unique:
            if not p or min(p) < 0:
                raise ValueError(f"path {p} must be a non-empty tuple of ranks >= 0")
            if len(p) > 1 and p[:-1] not in unique:
                raise ValueError(f"path {p} has no parent {p[:-1]} in the tree")
        object.__setattr__(self, "paths", tuple(sorted(unique, key=lambda p: (len(p), p))))

    @classmethod
    def from_list(cls, paths: Sequence[Sequence[int]]) -> Tree:
        return cls(tuple(tuple(p) for p in paths))

    def to_list(self) -> list[list[int]]:
        """JSON-able: the inverse of `from_list`."""
        return [list(p) for p in self.paths]

    def __len__(self) -> int:
        """Number of draft nodes (the root not counted): Medusa's "63"."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @cached_property
    def topk(self) -> list[int]:
        """Per depth (= per head): how many of that head's top tokens the tree uses."""
        return [1 + max(p[d] for p in self.paths if len(p) > d) for d in range(self.depth)]

    @cached_property
    def layout(self) -> TreeLayout:
        index = {p: i + 1 for i, p in enumerate(self.paths)}  # node 0 is the root
        return TreeLayout.from_parents([-1] + [index.get(p[:-1], 0) for p in self.paths])

    @cached_property
    def node_rank(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(head, rank) of every draft node, (len,) each: its token is topk_ids[head, rank]."""
        head = torch.tensor([len(p) - 1 for p in self.paths])
        rank = torch.tensor([p[-1] for p in self.paths])
        return head, rank

    @cached_property
    def retrieve(self) -> torch.Tensor:
        """(num_leaves, depth + 1) node indices of every root-to-leaf path, padded with -1."""
        leaves = set(self.paths) - {p[:-1] for p in self.paths}
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        rows = [[0] + [index[p[:d]] for d in range(1, len(p) + 1)] for p in sorted(leaves)]
        return torch.tensor([r + [-1] * (self.depth + 1 - len(r)) for r in rows])

    def candidates(
        self,
        root: torch.Tensor,
        head_logits: torch.Tensor,
        token_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Node tokens (1 + len,) from the root token () and the heads' logits (K, V).

        token_ids (V,): the target token of each logit column, for logits over a draft
        vocabulary (`DraftVocab.ids`); None: column j is token j."""
        if head_logits.shape[0] < self.depth:
            raise ValueError(f"tree of depth {self.depth} needs >= {self.depth} heads")
        topk_ids = head_logits[: self.depth].topk(max(self.topk), dim=-1).indices  # (depth, k)
        head, rank = self.node_rank
        nodes = topk_ids[head.to(topk_ids.device), rank.to(topk_ids.device)]
        if token_ids is not None:
            nodes = token_ids.to(nodes.device)[nodes]
        return torch.cat([root.view(1).to(nodes), nodes])


def chain(depth: int) -> Tree:
    """One path: every head's top-1 token (depth K = K heads)."""
    return Tree(tuple((0,) * d for d in range(1, depth + 1)))


def get_tree(spec: str | Sequence[Sequence[int]] | Tree) -> Tree:
    """A tree from config: a preset name, `chain<K>`, or a list of paths."""
    if isinstance(spec, Tree):
        return spec
    if isinstance(spec, str):
        if m := re.fullmatch(r"chain_?(\d+)", spec):
            return chain(int(m.group(1)))
        if spec not in PRESETS:
            raise ValueError(
                f"unknown tree {spec!r}: use chain<K>, a list of paths or one of {sorted(PRESETS)}"
            )
        return Tree.from_list(PRESETS[spec])
    return Tree.from_list(spec)


def build_tree(topk_acc: torch.Tensor | Sequence[Sequence[float]], num_nodes: int) -> Tree:
    """Greedy tree from per-head top-k accuracies (K, topk): topk_acc[i, r] = P(head i's rank-r
    token is right). A node's estimated acceptance probability is the product of its path's
    accuracies; add the best node whose parent is already in the tree, num_nodes times.

    Accuracies are <= 1, so a child never beats its parent: this picks the num_nodes best paths.
    Ties go to the shorter, then lexicographically smaller path (deterministic).
    """
    acc = torch.as_tensor(topk_acc, dtype=torch.float64).tolist()
    k_heads, topk = len(acc), len(acc[0])
    frontier = [(-acc[0][r], 1, (r,)) for r in range(topk)]  # (-score, depth, path)
    heapq.heapify(frontier)
    paths: list[Path] = []
    while frontier and len(paths) < num_nodes:
        neg, depth, path = heapq.heappop(frontier)
        paths.append(path)
        if depth < k_heads:
            for r in range(topk):
                heapq.heappush(frontier, (neg * acc[depth][r], depth + 1, path + (r,)))
    return Tree(tuple(paths))
