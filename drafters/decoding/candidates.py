"""A step's candidate tree: token paths below the root, each with an estimate of the probability
that the target's greedy output follows it, from any number of sources (a drafter, n-gram
lookup), merged and cut to the nodes worth verifying (docs/design.md section 5).

Why the scores add up. Under greedy verification at most one node per depth can be right (its
siblings carry other tokens), and the accepted length is the depth of the deepest right node
whose ancestors are all right. So E[accepted] = sum over depths of P(the right path reaches that
depth) = the sum of every node's P(its path is right). A tree of the n best nodes is therefore
worth 1 + (sum of their scores) tokens, and the best n-node tree is the n highest-scored nodes,
which is closed under parents because a node's score is its parent's times a probability.

A node's score = its parent's score x P(its token | its parent right). Each source gives the
second factor raw (a drafter's softmax probability, an n-gram prior), and `Calibration` scales
it per source and depth by what verification accepted so far in this generation, so the budget
choice (`choose_budget`) compares honest numbers. A token two sources propose is one node with
the higher score.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from drafters.decoding.tree import TreeLayout


@dataclass
class Node:
    parent: int  # index of the parent node (-1 for the root, node 0)
    token: int
    depth: int
    score: float  # calibrated P(path right)
    cond: dict[str, float] = field(default_factory=dict)  # source -> raw P(token | parent right)


class CandidateTree:
    """Candidates below one root token (node 0). `add` a child by (parent, token); the same
    child from two sources is one node (the higher score, both raw estimates kept)."""

    def __init__(self, root: int, calib: Calibration):
        self.calib = calib
        self.nodes: list[Node] = [Node(-1, int(root), 0, 1.0)]
        self._child: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        """Draft nodes, the root not counted."""
        return len(self.nodes) - 1

    def child_score(self, parent: int, cond: float, source: str) -> float:
        """The score a child of `parent` would get from this source's raw conditional."""
        depth = self.nodes[parent].depth + 1
        return self.nodes[parent].score * self.calib.score(source, depth, cond)

    def add(self, parent: int, token: int, cond: float, source: str) -> int:
        """The node for `token` below `parent`, created or merged; returns its index."""
        score = self.child_score(parent, cond, source)
        key = (parent, int(token))
        i = self._child.get(key)
        if i is None:
            i = len(self.nodes)
            self.nodes.append(Node(parent, int(token), self.nodes[parent].depth + 1, score))
            self._child[key] = i
        node = self.nodes[i]
        node.score = max(node.score, score)
        node.cond[source] = max(node.cond.get(source, 0.0), cond)
        return i

    def add_path(self, tokens: list[int], conds: list[float], source: str) -> list[int]:
        """A chain below the root: tokens[d] at depth d + 1, raw conditional conds[d]."""
        ids, parent = [], 0
        for t, cond in zip(tokens, conds, strict=True):
            parent = self.add(parent, t, cond, source)
            ids.append(parent)
        return ids

    def best(self, n: int) -> list[int]:
        """The n highest-scored draft nodes in topological order; closed under parents (a child
        never scores above its parent and ties go to the earlier, so a parent comes first)."""
        order = sorted(range(1, len(self.nodes)), key=lambda i: (-self.nodes[i].score, i))
        taken: set[int] = {0}
        for i in order:
            if len(taken) > n:
                break
            if self.nodes[i].parent in taken:
                taken.add(i)
        return sorted(taken - {0})

    def expected_gain(self, chosen: list[int]) -> float:
        """E[accepted draft tokens] of verifying `chosen`: the sum of their scores."""
        return sum(self.nodes[i].score for i in chosen)

    def scores_sorted(self) -> list[float]:
        """Scores of `best(n)`'s nodes in the order it takes them, for `choose_budget`."""
        chosen = self.best(len(self))
        return sorted((self.nodes[i].score for i in chosen), reverse=True)

    def layout(self, chosen: list[int], device) -> tuple[torch.Tensor, TreeLayout, list[int]]:
        """(tokens (1 + n,) root first, its TreeLayout, the node index of each row) for verifying
        the root and `chosen` (topologically ordered, closed under parents)."""
        rows = [0, *chosen]
        row_of = {node: r for r, node in enumerate(rows)}
        parents = [-1] + [row_of[self.nodes[i].parent] for i in chosen]
        tokens = torch.tensor([self.nodes[i].token for i in rows], device=device)
        return tokens, TreeLayout.from_parents(parents), rows


class Calibration:
    """Per source and depth, how verification treated that source's raw conditionals so far,
    over its verified nodes whose parent was accepted (the others say nothing about the
    conditional): how many (N), the sum of their raw estimates (P), how many were accepted (A).
    A raw estimate is scaled by c = (A + w) / (P + w), w = prior * P / N (the prior weighs as
    much as `prior` average nodes, so a source whose raw numbers are tiny but right is trusted
    after a few verifications, not hundreds), capped at 1. A depth without evidence borrows the
    factor of the depth above (1 at depth 1): a source found twice as good as it says at depth
    1 is assumed so at depth 2 until depth 2 is seen. One per generation: prompts differ
    (copying pays on some)."""

    def __init__(self, prior: float = 2.0):
        self.prior = prior
        self.count: dict[tuple[str, int], int] = {}
        self.predicted: dict[tuple[str, int], float] = {}
        self.accepted: dict[tuple[str, int], float] = {}

    def evidence(self, source: str, depth: int) -> int:
        """How many of this source's nodes at this depth were verified below accepted parents."""
        return self.count.get((source, depth), 0)

    def factor(self, source: str, depth: int) -> float:
        key = (source, depth)
        n = self.count.get(key, 0)
        if n == 0:
            return self.factor(source, depth - 1) if depth > 1 else 1.0
        p = self.predicted[key]
        w = self.prior * p / n
        return (self.accepted[key] + w) / (p + w) if p + w > 0 else 1.0

    def score(self, source: str, depth: int, raw: float) -> float:
        return min(1.0, raw * self.factor(source, depth))

    def update(self, tree: CandidateTree, verified: list[int], accepted: set[int]) -> None:
        """After a verification of the nodes `verified`, of which `accepted` were on the accepted
        path: a node whose parent is the root or accepted counts once per source proposing it."""
        for i in verified:
            node = tree.nodes[i]
            if node.parent != 0 and node.parent not in accepted:
                continue
            for source, raw in node.cond.items():
                key = (source, node.depth)
                self.count[key] = self.count.get(key, 0) + 1
                self.predicted[key] = self.predicted.get(key, 0.0) + raw
                self.accepted[key] = self.accepted.get(key, 0.0) + (i in accepted)


def choose_budget(scores: list[float], cost: list[float], max_nodes: int | None = None) -> int:
    """The number of candidate nodes n to verify (0: a plain AR step) that maximises expected
    tokens per unit of time, (1 + sum of the n best scores) / cost[n]: `scores` sorted as
    `CandidateTree.scores_sorted` gives them, `cost[n]` the time of a step verifying n nodes
    (n + 1 rows) in units of a plain AR step (cost[0] = 1; `forward_cost_profile` measures
    t(rows) / t(1)). Ties go to the smaller tree."""
    limit = min(len(scores), len(cost) - 1, max_nodes if max_nodes is not None else len(scores))
    best_n, best_rate, gain = 0, 1.0 / cost[0], 0.0
    for n in range(1, limit + 1):
        gain += scores[n - 1]
        rate = (1.0 + gain) / cost[n]
        if rate > best_rate + 1e-12:
            best_n, best_rate = n, rate
    return best_n
