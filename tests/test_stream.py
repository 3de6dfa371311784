"""Streaming (`stream=` of every decoder): each step's kept tokens arrive at once, in order, and
together they are the output; and head decoders project only the heads a tree reads."""

import torch

from drafters.decoding import decode_ar, decode_heads
from drafters.decoding.falcon import decode_falcon
from drafters.decoding.heads import head_logits
from drafters.models import FalconConfig, FalconDrafter, build_drafter
from drafters.testing import tiny_target
from drafters.training.run import drafter_config


def _collect():
    chunks = []
    return chunks, chunks.append


def test_every_decoder_streams_its_steps():
    target = tiny_target(seed=0)
    ids = target.tokenizer("The quick brown fox", return_tensors="pt").input_ids
    torch.manual_seed(0)
    heads = build_drafter("medusa", drafter_config("medusa", {}, target)).eval()
    falcon = FalconDrafter(FalconConfig.from_target_config(target.config, k=2)).eval()
    runs = {
        "ar": lambda s: decode_ar(target, ids, 17, stream=s),
        "heads": lambda s: decode_heads(target, heads, "mc_sim_7b_63", ids, 17, stream=s),
        "falcon": lambda s: decode_falcon(target, falcon, ids, 17, tree="falcon_k2_32", stream=s),
    }
    for name, run in runs.items():
        chunks, stream = _collect()
        res = run(stream)
        assert [t for c in chunks for t in c] == res.output_ids.tolist(), name
        assert len(chunks) == 1 + res.verify_forwards  # the prefill's token, then one per step
        assert [len(c) for c in chunks[1:]] == res.step_tokens, name
        assert torch.equal(res.sequences, run(None).sequences)


def test_head_logits_are_the_first_heads_of_the_full_forward():
    target = tiny_target(seed=0)
    f = torch.randn(1, 1, target.hidden_size)
    for kind, over in [("medusa", {}), ("cerberus", {"draft_vocab_size": 64}),
                       ("medusa", {"trainable_lm_head": True})]:  # fmt: skip
        torch.manual_seed(0)
        model = build_drafter(kind, drafter_config(kind, over, target)).eval()
        if over.get("trainable_lm_head"):
            model.load_lm_head(target.lm_head.weight.detach())
        with torch.inference_mode():
            full = model(f, target.lm_head)[0, 0]  # (K, V or V_d)
            for depth in (1, 2, model.num_heads):
                got = head_logits(model, f, target.lm_head, depth)
                torch.testing.assert_close(got, full[:depth], rtol=1e-5, atol=1e-5)
