"""Falcon tree specs: the released tree, the small presets, the builder, and the per-pass plan."""

import json
from collections import Counter

import pytest
import torch
from omegaconf import OmegaConf

from drafters.decoding import (
    FALCON_PRESETS,
    FalconPlan,
    Tree,
    build_falcon_tree,
    build_tree,
    chain,
    get_falcon_tree,
)
from drafters.decoding.falcon_tree import SMALL_MAX_ANCHORS, SMALL_PROFILE


def test_released_tree():
    tree = get_falcon_tree("kmask2_8layer_tree", k=2)
    assert len(tree) == 165 and tree.depth == 8
    per_depth = Counter(len(p) for p in tree.paths)
    assert [per_depth[d] for d in range(1, 9)] == [20, 15, 19, 23, 21, 23, 21, 23]
    assert tree.topk[0] == 20  # Falcon's top-20 lists
    plan = FalconPlan.from_tree(tree, k=2)
    assert plan.passes == 4
    # 7, 11, 12 anchors (depth-2b nodes with descendants) x k positions fed by passes 2, 3, 4
    assert plan.drafter_positions() == [14, 22, 24]
    assert [b.width for b in plan.blocks] == [20, 10, 10, 9]
    assert Tree.from_list(json.loads(json.dumps(tree.to_list()))) == tree


def test_small_presets_and_specs():
    small = get_falcon_tree("falcon_k2_32", k=2)
    assert len(small) == 32 and small.depth == 8
    built = build_falcon_tree(SMALL_PROFILE, 32, k=2, max_anchors=SMALL_MAX_ANCHORS)
    assert small == built  # the written-out preset is the builder's output
    assert FalconPlan.from_tree(small, 2).drafter_positions() == [6, 6, 2]
    assert get_falcon_tree("chain", k=2) == chain(8)  # m = 4 passes of top-1
    assert get_falcon_tree("chain", k=3) == chain(12)
    assert get_falcon_tree("chain5", k=2) == chain(5)
    assert get_falcon_tree([[0], [0, 0]], k=2) == chain(2)
    assert get_falcon_tree(OmegaConf.create({"t": [[0], [0, 0]]}).t, k=2) == chain(2)
    assert set(FALCON_PRESETS) == {"kmask2_8layer_tree", "falcon_k2_32"}
    with pytest.raises(ValueError, match="unknown Falcon tree"):
        get_falcon_tree("mc_sim_7b_63", k=2)


def test_builder_is_build_tree_without_a_cap_and_caps_anchors():
    acc = torch.rand(6, 5, generator=torch.Generator().manual_seed(0))
    assert build_falcon_tree(acc, 40, k=2) == build_tree(acc, 40)
    capped = build_falcon_tree(acc, 40, k=2, max_anchors=2)
    assert len(capped) == 40 and capped.depth <= 6
    anchors = FalconPlan.from_tree(capped, 2).drafter_positions()
    assert all(n <= 2 * 2 for n in anchors)
    # hand example, k = 2, scores: (0,) .9, (0,0) .72, (0,1) .45, (0,0,0) .36, (0,0,1) .288,
    # (0,1,0) .225, (0,0,0,0) .18; (0,1,0) needs a 2nd anchor at depth 2: skipped with max 1
    acc = [[0.9, 0.1], [0.8, 0.5], [0.5, 0.4], [0.5, 0.1]]
    top6 = {(0,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 1)}
    assert set(build_falcon_tree(acc, 6, k=2).paths) == top6 | {(0, 1, 0)}
    assert set(build_falcon_tree(acc, 6, k=2, max_anchors=1).paths) == top6 | {(0, 0, 0, 0)}


def test_plan_of_a_hand_tree():
    # k = 2; root 0; depth 1: (0)=1 (1)=2; depth 2: (0,0)=3 (0,1)=4 (1,0)=5;
    # depth 3: (0,0,0)=6 (1,0,0)=7; depth 4: (0,0,0,0)=8 (0,0,0,1)=9 (1,0,0,0)=10;
    # depth 5: (0,0,0,0,0)=11
    paths = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0, 0]]
    paths += [[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0, 0]]
    plan = FalconPlan.from_tree(Tree.from_list(paths), k=2)
    b0, b1, b2 = plan.blocks
    assert b0.anchors.tolist() == [0] and b0.nodes.tolist() == [1, 2, 3, 4, 5]
    assert b0.offset.tolist() == [0, 0, 1, 1, 1] and b0.rank.tolist() == [0, 1, 0, 1, 0]
    assert b0.slot.tolist() == [0] * 5 and b0.width == 2
    # pass 2: anchors (0,0) and (1,0), fed the tokens of depths 1-2 on their paths
    assert b1.anchors.tolist() == [3, 5] and b1.feed.tolist() == [[1, 3], [2, 5]]
    assert b1.source.tolist() == [0, 0]
    assert b1.nodes.tolist() == [6, 7, 8, 9, 10] and b1.slot.tolist() == [0, 1, 0, 0, 1]
    assert b1.offset.tolist() == [0, 0, 1, 1, 1] and b1.rank.tolist() == [0, 0, 0, 1, 0]
    block = torch.ones(2, 2, dtype=torch.bool)
    assert torch.equal(b1.attend, torch.block_diag(block, block))  # each block sees itself
    # pass 3: anchor (0,0,0,0) = 8, below anchor slot 0 of pass 2: sees that block and itself
    assert b2.anchors.tolist() == [8] and b2.feed.tolist() == [[6, 8]] and b2.source.tolist() == [0]
    assert b2.attend.tolist() == [[True, True, False, False, True, True]] * 2
    assert b2.nodes.tolist() == [11] and b2.offset.tolist() == [0] and b2.width == 1
