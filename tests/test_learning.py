"""Each drafter can fit a batch of the target's own greedy output (the training signal is sound:
labels, masks, losses and gradients line up end to end)."""

import pytest
import torch

from drafters.training.module import DrafterLitModule
from drafters.training.run import drafter_config


@pytest.fixture(scope="module")
def greedy_batch(tiny):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 250, (2, 8), generator=g)
    ids = tiny.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40,
                              min_new_tokens=40, do_sample=False)  # fmt: skip
    loss_mask = torch.cat([torch.zeros(2, 8), torch.ones(2, 40)], 1).long()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


@pytest.mark.parametrize(
    "kind, extra, key, reach",
    [
        ("falcon", {"csgd": {"teacher_forcing_only": True}}, "acc_pos1", 0.8),
        ("falcon", {"csgd": {"lambda_start": 0.4}}, "acc_pass2_pos1", 0.8),
        ("falcon", {"csgd": {"lambda_start": 0.4}}, "acc_depth3", 0.8),
        ("falcon", {"csgd": {"variant": "paper"}}, "acc_pass2_pos1", 0.8),
        ("medusa", {}, "acc_head0", 0.5),  # one ResBlock per head: less capacity
        ("cerberus", {"gate": "learned"}, "acc_head1", 0.8),
    ],
)
def test_drafter_fits_a_batch_of_greedy_output(kind, extra, key, reach, tiny, greedy_batch):
    torch.manual_seed(0)
    module = DrafterLitModule(kind=kind, model=drafter_config(kind, {}, tiny),
                              loss={"feature_noise": 0.0}, **extra).attach(tiny)  # fmt: skip
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=3e-3)
    _, before, _ = module.compute_loss(greedy_batch, train=False)
    for _ in range(100):
        loss, _, _ = module.compute_loss(greedy_batch, train=kind == "falcon")
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, after, _ = module.compute_loss(greedy_batch, train=False)
    assert before[key] < 0.2 and after[key] > reach, (float(before[key]), float(after[key]))
