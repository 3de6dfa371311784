import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from drafters.models import CerberusConfig, CerberusHeads, build_drafter
from drafters.models.cerberus import num_params

D, V = 8, 30


def _randomised(cfg, seed=0):
    torch.manual_seed(seed)
    heads = CerberusHeads(cfg)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.5)
    return heads


def _reference(heads: CerberusHeads, f: torch.Tensor) -> torch.Tensor:
    """docs/design.md section 3, one head at a time in a Python loop."""
    K = heads.num_heads
    u = [f] * K
    for layer in heads.layers:
        new = []
        for i in range(K):
            x = torch.cat([u[i], u[i - 1] if i > 0 else f], dim=-1)  # (B, T, 2d)
            h = x @ layer.weight[i] + layer.bias[i]
            res = u[i] if layer.proj is None else x @ layer.proj[i]
            new.append(res + F.silu(h))
        u = new
    return torch.stack(u, dim=2)


@pytest.mark.parametrize("learned", [False, True])
def test_shapes_and_matches_per_head_reference(learned):
    heads = _randomised(CerberusConfig(D, V, num_heads=4, num_layers=3, learned_residual=learned))
    f = torch.randn(2, 5, D)
    assert heads.hidden(f).shape == (2, 5, 4, D)
    assert heads(f, nn.Linear(D, V, bias=False)).shape == (2, 5, 4, V)
    torch.testing.assert_close(heads.hidden(f), _reference(heads, f))


@pytest.mark.parametrize(
    "k,layers,learned,trainable", [(4, 2, False, False), (3, 2, True, False), (2, 3, True, True)]
)
def test_num_params_formula(k, layers, learned, trainable):
    cfg = CerberusConfig(D, V, k, layers, learned, trainable)
    got = sum(p.numel() for p in CerberusHeads(cfg).parameters())
    want = layers * k * (2 * D * D + D) + (layers * k * 2 * D * D if learned else 0)
    assert got == num_params(cfg) == want + (V * D if trainable else 0)


def test_layers_do_not_share_storage():
    heads = CerberusHeads(CerberusConfig(D, V, num_layers=3, learned_residual=True))
    ptrs = [p.data_ptr() for p in heads.parameters()]
    assert len(ptrs) == len(set(ptrs)) == 3 * 3


@pytest.mark.parametrize("learned", [False, True])
def test_zero_init_is_identity(learned):
    heads = CerberusHeads(CerberusConfig(D, V, learned_residual=learned))
    f = torch.randn(2, 3, D)
    torch.testing.assert_close(heads.hidden(f), f.unsqueeze(2).expand(2, 3, 4, D))
    heads.hidden(f).pow(2).sum().backward()
    assert heads.layers[0].weight.grad.abs().sum() > 0


def test_head_i_depends_on_head_i_minus_1_and_never_on_later_heads():
    cfg = CerberusConfig(D, V, num_heads=4, num_layers=2)
    f = torch.randn(1, 3, D)
    base = _randomised(cfg).hidden(f)
    for j in range(4):  # perturb head j's layer-0 parameters only
        heads = _randomised(cfg)
        with torch.no_grad():
            heads.layers[0].weight[j] += 1.0
            heads.layers[0].bias[j] += 1.0
        out = heads.hidden(f)
        for i in range(4):
            changed = not torch.allclose(out[:, :, i], base[:, :, i])
            assert changed == (i in (j, j + 1)), (i, j)  # L=2: heads j and j+1 only
    heads = _randomised(cfg)
    with torch.no_grad():  # the last layer of a later head never reaches head 0
        heads.layers[1].weight[1:] += 1.0
    torch.testing.assert_close(heads.hidden(f)[:, :, 0], base[:, :, 0])


def test_no_target_head_in_state_dict_and_build():
    cfg = CerberusConfig(D, V)
    heads = build_drafter("cerberus", dataclasses.asdict(cfg))
    assert isinstance(heads, CerberusHeads)
    assert all(V not in t.shape for t in heads.state_dict().values())
    own = CerberusHeads(CerberusConfig(D, V, trainable_lm_head=True))
    w = torch.randn(V, D)
    own.load_lm_head(w)
    torch.testing.assert_close(own.state_dict()["lm_head.weight"], w)
