"""The HF peers measure the knobs they name: an early-exit drafter's draft length and
confidence threshold reach HF's candidate generator, and the model's own settings come back."""

import torch
from transformers.generation import candidate_generator

from drafters.eval.methods import hf_method


def test_early_exit_settings_reach_the_assistant(tiny, monkeypatch):
    seen = []
    original = candidate_generator.EarlyExitCandidateGenerator.get_candidates

    def spy(self, input_ids):
        cfg = self.assistant_generation_config
        seen.append((self.num_assistant_tokens, cfg.assistant_confidence_threshold))
        return original(self, input_ids)

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "get_candidates", spy)
    config = tiny.model.generation_config
    before = (config.num_assistant_tokens, config.assistant_confidence_threshold)
    ids = torch.tensor([[1, 5, 7, 9]])
    outputs = {}
    for n, thr in [(3, 0.0), (7, 0.6)]:
        seen.clear()
        method = hf_method(tiny, f"ee_{n}", assistant_early_exit=1, num_assistant_tokens=n,
                           assistant_confidence_threshold=thr)  # fmt: skip
        outputs[n], _ = method.generate(ids, 12)
        assert seen and seen[0] == (n, thr)
        assert method.info["num_assistant_tokens"] == n
    assert (config.num_assistant_tokens, config.assistant_confidence_threshold) == before
    greedy, _ = hf_method(tiny, "hf_greedy").generate(ids, 12)
    assert outputs[3] == outputs[7] == greedy  # lossless whatever the knobs
