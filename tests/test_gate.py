import math

import torch
import torch.nn.functional as F

from drafters.losses import heads_loss
from drafters.models import EntropyGate, LearnedGate, LearnedGateConfig, entropy, gate_labels


def test_entropy():
    assert math.isclose(entropy(torch.zeros(7)).item(), math.log(7), rel_tol=1e-6)
    assert entropy(torch.tensor([100.0, 0.0, 0.0])).item() < 1e-6
    assert entropy(torch.zeros(2, 3, 5)).shape == (2, 3)


def _one_hot_logits(tokens, V):
    return F.one_hot(tokens, V).float() * 10


def test_gate_labels_hand_built():
    V = 6
    labels = torch.tensor([[[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]])  # (1, 3, 4)
    preds = torch.tensor([[[1, 2, 0, 4], [0, 2, 3, 4], [1, 2, 3, 4]]])
    mask = torch.ones(1, 3, 4, dtype=torch.bool)
    mask[0, 2, 3] = False  # last head of position 2 has no label
    y = gate_labels(_one_hot_logits(preds, V), labels, mask)
    want = torch.tensor([[[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]]).float()
    assert torch.equal(y, want)


def test_entropy_gate_default_fit_and_state_dict():
    gate = EntropyGate(num_heads=4, num_bins=8, max_entropy=8.0)
    h = torch.linspace(0, 8, 50)
    ea = gate.calibrate(h)
    assert (ea[1:] <= ea[:-1]).all() and ea[0] > ea[-1]  # default: decreasing in entropy
    logits = torch.randn(3, 5, 20)
    assert gate.expected_accept(torch.randn(3, 5, 16), logits).shape == (3, 5)

    g = torch.Generator().manual_seed(0)
    ent = torch.rand(2000, generator=g) * 6
    acc = (4 - ent / 1.5 + torch.randn(2000, generator=g) * 0.3).clamp(0, 4)  # noisy, falling
    gate.fit(ent, acc)
    assert gate.fitted.item()
    assert (gate.values[1:] <= gate.values[:-1] + 1e-6).all()  # monotone after PAV
    assert abs(gate.calibrate(torch.tensor(0.3)).item() - 3.8) < 0.4
    assert abs(gate.calibrate(torch.tensor(5.7)).item() - 0.2) < 0.4

    fresh = EntropyGate(num_heads=4, num_bins=8, max_entropy=8.0)
    fresh.load_state_dict(gate.state_dict())
    assert set(gate.state_dict()) == {"edges", "values", "fitted"}
    torch.testing.assert_close(fresh.calibrate(ent), gate.calibrate(ent))


def test_learned_gate_shapes_params_expected_accept():
    cfg = LearnedGateConfig(hidden_size=16, num_heads=4, hidden_dim=32)
    gate = LearnedGate(cfg)
    assert (
        sum(p.numel() for p in gate.parameters()) == cfg.num_params() == 17 * 32 + 32 + 32 * 4 + 4
    )
    f, logits = torch.randn(2, 3, 16), torch.randn(2, 3, 50)
    out = gate(f, logits)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(gate(f, target_entropy=entropy(logits)), out)
    torch.testing.assert_close(gate.expected_accept(f, logits), torch.sigmoid(out).sum(-1))


def test_heads_loss_gate_bce_and_calibration_hand_built():
    # T = 8, all positions generated: head i at t has a label iff t + 2 + i <= 7
    V, T, K = 5, 8, 2
    ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    mask = torch.ones(1, T)
    preds = torch.stack([torch.roll(ids, -2 - i, dims=1) for i in range(K)], dim=-1)  # all right
    preds[0, 0, 0] = (ids[0, 2] + 1) % V  # head 0 wrong at t=0 -> y[0] = (0, 0)
    preds[0, 1, 1] = (ids[0, 4] + 1) % V  # head 1 wrong at t=1 -> y[1] = (1, 0)
    logits = _one_hot_logits(preds, V)
    gate_logits = torch.zeros(1, T, K)  # p = 0.5 everywhere -> E[a] = 1
    _, m = heads_loss(logits, ids, mask, gate_logits=gate_logits)
    # labelled: head 0 at t = 0..5, heads 0..1 at t = 0..4; BCE(0, y) = log 2 for any y
    assert math.isclose(m["gate_bce"].item(), 2 * math.log(2), rel_tol=1e-5)
    # actual top-1 chain length at t = 0..4: 0, 1, 2, 2, 2 -> mean 1.4; predicted 1.0
    assert math.isclose(m["gate_calib"].item(), 1.0 - 1.4, abs_tol=1e-5)
    assert math.isclose(m["acc_head0"].item(), 5 / 6, rel_tol=1e-5)
    assert math.isclose(m["acc_head1"].item(), 4 / 5, rel_tol=1e-5)
