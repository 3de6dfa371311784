import dataclasses

import pytest
import torch
from torch import nn

from drafters.models import MedusaConfig, MedusaHeads, build_drafter
from drafters.models.medusa import num_params

D, V = 16, 40


def _lm_head(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(D, V, bias=False).requires_grad_(False)


def test_shapes():
    heads = MedusaHeads(MedusaConfig(D, V, num_heads=3, num_layers=2))
    f = torch.randn(2, 5, D)
    assert heads.hidden(f).shape == (2, 5, 3, D)
    assert heads(f, _lm_head()).shape == (2, 5, 3, V)
    assert heads.num_heads == 3


@pytest.mark.parametrize("k,layers,trainable", [(4, 1, False), (3, 2, False), (2, 3, True)])
def test_num_params_formula(k, layers, trainable):
    cfg = MedusaConfig(D, V, num_heads=k, num_layers=layers, trainable_lm_head=trainable)
    got = sum(p.numel() for p in MedusaHeads(cfg).parameters())
    assert got == num_params(cfg) == k * layers * (D * D + D) + (V * D if trainable else 0)


def test_stacked_blocks_do_not_share_storage():
    heads = MedusaHeads(MedusaConfig(D, V, num_heads=3, num_layers=3))
    ptrs = [p.data_ptr() for p in heads.parameters()]
    assert len(ptrs) == len(set(ptrs)) == 3 * 3 * 2
    blocks = [blk for head in heads.heads for blk in head]
    assert len({id(b) for b in blocks}) == 9


def test_zero_init_is_identity_and_trains():
    heads = MedusaHeads(MedusaConfig(D, V, num_heads=2, num_layers=2))
    lm = _lm_head()
    f = torch.randn(2, 4, D)
    assert torch.equal(heads.hidden(f), f.unsqueeze(2).expand(2, 4, 2, D))
    torch.testing.assert_close(heads(f, lm)[:, :, 1], lm(f))
    heads(f, lm).logsumexp(-1).sum().backward()
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0 for p in heads.heads[0][0].parameters()
    )
    assert lm.weight.grad is None


def test_target_head_never_stored_unless_trainable():
    frozen = MedusaHeads(MedusaConfig(D, V))
    assert all(V not in t.shape for t in frozen.state_dict().values())
    with pytest.raises(ValueError):
        frozen(torch.randn(1, 2, D))  # needs the target's head

    own = MedusaHeads(MedusaConfig(D, V, trainable_lm_head=True))
    lm = _lm_head(1)
    own.load_lm_head(lm.weight)
    assert own.state_dict()["lm_head.weight"].shape == (V, D)
    f = torch.randn(1, 3, D)
    other = _lm_head(2)
    torch.testing.assert_close(own(f, other)[:, :, 0], lm(f))  # passed-in head is ignored
    assert own.lm_head.weight.data_ptr() != lm.weight.data_ptr()


def test_build_drafter_roundtrip():
    cfg = MedusaConfig(D, V, num_heads=2)
    m = build_drafter("medusa", dataclasses.asdict(cfg))
    assert isinstance(m, MedusaHeads) and m.cfg == cfg
    with pytest.raises(ValueError, match="unknown keys"):
        build_drafter("medusa", {**dataclasses.asdict(cfg), "bogus": 1})
    with pytest.raises(ValueError, match="unknown drafter"):
        build_drafter("eagle", {})
