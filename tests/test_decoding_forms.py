"""Every decoder path stays equal to HF greedy (fp32) on the embedded target whichever form its
linears take (`drafters.decoding.linears`): each form forced for every linear and row count, and
the plan measured on this machine."""

import pytest
import torch
from test_decoding_ar import greedy

from drafters.decoding import decode_ar, decode_heads
from drafters.decoding.dynamic import DynamicConfig, decode_dynamic
from drafters.decoding.falcon import decode_falcon
from drafters.models import (
    CerberusConfig,
    CerberusHeads,
    EntropyGate,
    FalconConfig,
    FalconDrafter,
    MedusaConfig,
    MedusaHeads,
)

N = 24
# trees of 5-9 verified rows, where the forms differ most (and the test stays short)
HEADS_TREE = [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0], [0, 0, 1]]
FALCON_TREE = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]]


def paths(target):
    d, v = target.hidden_size, target.vocab_size
    torch.manual_seed(0)
    medusa = MedusaHeads(MedusaConfig(d, v)).eval()
    cerberus = CerberusHeads(CerberusConfig(d, v)).eval()
    falcon = FalconDrafter(FalconConfig.from_target_config(target.config, k=2)).eval()
    return {
        "ar": lambda ids: decode_ar(target, ids, N),
        "medusa": lambda ids: decode_heads(target, medusa, HEADS_TREE, ids, N),
        "cerberus+gate": lambda ids: decode_heads(target, cerberus, HEADS_TREE, ids, N,
                                                  gate=EntropyGate(), cost_ratio=1.5),
        "falcon": lambda ids: decode_falcon(target, falcon, ids, N, tree=FALCON_TREE),
        "dynamic+ngram": lambda ids: decode_dynamic(target, falcon, ids, N,
                                                    DynamicConfig(budget=6)),
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("form", ["small", "mm", None])
def test_every_decoder_path_is_lossless_in_every_form(smollm2, form, monkeypatch):
    if form is not None:
        monkeypatch.setenv("DRAFTERS_LINEAR_FORMS", form)
    ids = smollm2.tokenizer("List the planets: Mercury, Venus,", return_tensors="pt").input_ids
    ref = greedy(smollm2, ids, N)
    for name, run in paths(smollm2).items():
        res = run(ids)
        assert torch.equal(res.sequences, ref), (form, name)
