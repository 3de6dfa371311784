"""Tree structures: presets, layout (parents, depth, ancestor mask), retrieval, build_tree."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from drafters.decoding.tree import (
    MC_SIM_7B_63,
    Tree,
    TreeLayout,
    build_tree,
    chain,
    get_tree,
)

# root, then (0,) (1,) | (0,0) (0,1) (1,0) | (0,0,0)  ->  node indices 0..6
HAND = [[0, 0, 0], [1], [0, 1], [0], [1, 0], [0, 0]]


def test_mc_sim_7b_63_preset():
    tree = get_tree("mc_sim_7b_63")
    assert len(tree) == 63 and tree.depth == 4
    assert tree.topk == [10, 10, 10, 2]
    assert len(tree.layout) == 64 and tree.layout.depth.max() == 4
    assert sorted(map(tuple, MC_SIM_7B_63)) == sorted(tree.paths)
    assert len(tree.retrieve) == 42  # leaves


def test_small_presets():
    small = get_tree("mc_sim_7b_63_first16")
    assert len(small) == 16 and small.depth == 3
    assert get_tree("chain4") == chain(4) == Tree(((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)))
    assert get_tree([[0], [0, 0]]) == chain(2)
    assert get_tree(OmegaConf.create({"tree": [[0], [0, 0]]}).tree) == chain(2)  # from config
    with pytest.raises(ValueError, match="unknown tree"):
        get_tree("nope")


def test_layout_of_hand_built_tree():
    tree = Tree.from_list(HAND)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    layout = tree.layout
    assert layout.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert layout.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(layout.ancestors, expected)
    assert tree.topk == [2, 2, 1]
    assert tree.retrieve.tolist() == [[0, 1, 3, 6], [0, 1, 4, -1], [0, 2, 5, -1]]


def test_candidates_gather_heads_topk():
    tree = Tree.from_list(HAND)
    v = 10
    heads = torch.zeros(3, v)
    heads[0, [7, 3]] = torch.tensor([2.0, 1.0])  # head 0: rank 0 = 7, rank 1 = 3
    heads[1, [5, 9]] = torch.tensor([2.0, 1.0])
    heads[2, 4] = 1.0
    tokens = tree.candidates(torch.tensor(1), heads)
    assert tokens.tolist() == [1, 7, 3, 5, 9, 5, 4]


def test_json_roundtrip_and_validation():
    tree = get_tree("mc_sim_7b_63")
    again = Tree.from_list(json.loads(json.dumps(tree.to_list())))
    assert again == tree
    with pytest.raises(ValueError, match="no parent"):
        Tree.from_list([[0], [1, 0, 0]])
    with pytest.raises(ValueError, match="once"):
        Tree.from_list([[0], [0]])
    with pytest.raises(ValueError, match="topological"):
        TreeLayout.from_parents([-1, 2, 0])


def test_build_tree_greedy_by_path_probability():
    acc = [[0.8, 0.1, 0.05], [0.6, 0.2, 0.1], [0.5, 0.1, 0.1]]
    # scores: (0,) .8, (0,0) .48, (0,0,0) .24, (0,1) .16, (1,) .1, (0,2) .08, (1,0) .06, ...
    tree = build_tree(acc, num_nodes=5)
    assert set(tree.paths) == {(0,), (0, 0), (0, 0, 0), (0, 1), (1,)}
    assert build_tree([[1.0, 0.0], [1.0, 0.0]], num_nodes=2) == chain(2)
    big = build_tree(torch.rand(4, 10), num_nodes=40)
    assert len(big) == 40 and big.depth <= 4  # closed under parents (checked by Tree)
