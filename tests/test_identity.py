"""The target identity: architecture + tokenizer + a fingerprint of the weights."""

import pytest
import torch

from drafters.target import Target, TargetError, from_pretrained
from drafters.target_identity import LEGACY_KEYS
from drafters.testing import tiny_target, tiny_tokenizer


def legacy(identity) -> dict:
    """The identity dict as code before the weights fingerprint wrote it."""
    return {k: identity.to_dict()[k] for k in LEGACY_KEYS}


def save(target: Target, folder, **kwargs):
    target.model.save_pretrained(folder, **kwargs)
    target.tokenizer.save_pretrained(folder)
    return str(folder)


def test_other_weights_same_shapes_are_refused_naming_both(tiny):
    other = tiny_target(seed=1)
    msg = tiny.identity.mismatch(other.identity, "drafter /d")
    assert msg is not None and "weights_hash" in msg
    assert "tiny-random-llama-seed0" in msg and "tiny-random-llama-seed1" in msg
    # the same weights under another name (a hub id and its local copy) agree
    renamed = tiny_target(seed=0, name="copy")
    assert tiny.identity.mismatch(renamed.identity, "x") is None


def test_architecture_beyond_the_shapes_counts(tiny):
    deeper = tiny_target(seed=0, num_layers=3)  # same hidden_size, vocab_size and tokenizer
    msg = tiny.identity.mismatch(deeper.identity, "cache /c")
    assert "num_hidden_layers: cache /c has 3, the loaded target has 2" in msg
    wider = tiny_target(seed=0, intermediate_size=96)
    assert "intermediate_size" in tiny.identity.mismatch(wider.identity, "x")
    fewer_kv = tiny_target(seed=0, num_kv_heads=4)
    assert "num_key_value_heads" in tiny.identity.mismatch(fewer_kv.identity, "x")


def test_dtype_does_not_change_the_identity(tmp_path, tiny):
    assert tiny_target(seed=0, dtype="bfloat16").identity == tiny.identity
    folder = save(tiny, tmp_path / "m")
    for dtype in ("float32", "bfloat16"):
        loaded = from_pretrained(folder, dtype=dtype, name=tiny.name)
        assert loaded.dtype == getattr(torch, dtype)
        assert loaded.identity == tiny.identity


def test_fingerprint_from_files_equals_from_parameters(tmp_path, tiny):
    """A `device="meta"` target (vLLM runs the model) fingerprints its checkpoint files."""
    folder = save(tiny, tmp_path / "one")
    meta = from_pretrained(folder, dtype="bfloat16", device="meta", name=tiny.name)
    assert meta.lm_head.weight.device.type == "meta"
    assert meta.identity == tiny.identity
    sharded = save(tiny, tmp_path / "sharded", max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    meta = from_pretrained(sharded, dtype="float32", device="meta", name=tiny.name)
    assert meta.identity == tiny.identity


def test_tied_embeddings_fingerprint_from_files_and_parameters(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    tied = Target(model, tok, "tied")
    folder = save(tied, tmp_path / "tied")
    from safetensors import safe_open

    with safe_open(f"{folder}/model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # stored once, as the embedding
    meta = from_pretrained(folder, device="meta", name="tied")
    assert meta.identity == tied.identity


def test_fingerprint_from_bin_files_and_hub_snapshots(tmp_path, tiny, monkeypatch):
    """A .bin checkpoint (memory-mapped), and a hub id resolved to its snapshot folder with
    only the checkpoint files of its index fetched."""
    import json
    import shutil

    import huggingface_hub
    from huggingface_hub import errors

    from drafters.target_identity import weights_fingerprint

    folder = tmp_path / "bin"
    save(tiny, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save(tiny.model.state_dict(), folder / "pytorch_model.bin")
    torch.save({"lr": 1.0}, folder / "training_args.bin")  # not a state dict: skipped
    meta = from_pretrained(str(folder), device="meta", name=tiny.name)
    assert meta.identity == tiny.identity

    snapshot = tmp_path / "hub" / "snapshots" / "abc"
    save(tiny, tmp_path / "repo", max_shard_size="40KB")
    index = json.loads((tmp_path / "repo" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    absent = getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError)
    fetched = []

    def hf_hub_download(repo_id, filename):
        assert repo_id == "org/tiny"
        if not (tmp_path / "repo" / filename).exists():
            raise absent(f"{filename} not in {repo_id}")
        snapshot.mkdir(parents=True, exist_ok=True)
        fetched.append(filename)
        return str(shutil.copy(tmp_path / "repo" / filename, snapshot / filename))

    def snapshot_download(repo_id, allow_patterns):
        return [hf_hub_download(repo_id, f) for f in allow_patterns]

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with torch.device("meta"):
        from transformers import LlamaForCausalLM

        empty = LlamaForCausalLM(tiny.config)
    assert weights_fingerprint(empty, "org/tiny") == tiny.identity.weights_hash
    assert sorted(fetched) == sorted(["model.safetensors.index.json", *shards])


def test_fingerprint_needs_the_weights(tmp_path, tiny):
    folder = save(tiny, tmp_path / "m")
    for f in (tmp_path / "m").glob("*.safetensors"):
        f.unlink()
    meta = from_pretrained(folder, device="meta")
    with pytest.raises(TargetError, match="no \\*.safetensors or \\*.bin"):
        meta.identity  # noqa: B018


def test_older_identity_is_compared_on_its_keys_and_its_name(tiny):
    """Identities stored before the fingerprint ({name, hidden_size, vocab_size,
    tokenizer_hash}): accepted on those fields plus the name, else refused naming both."""
    old = legacy(tiny.identity)
    assert tiny.identity.mismatch(old, "x") is None
    seed1 = tiny_target(seed=1)
    msg = seed1.identity.mismatch(old, "dataset /d")
    assert "name: dataset /d has 'tiny-random-llama-seed0'" in msg
    assert "tiny-random-llama-seed1" in msg
    msg = tiny.identity.mismatch({**old, "tokenizer_hash": "0" * 16}, "x")
    assert "tokenizer_hash" in msg and "name" not in msg.split("\n", 1)[1]


def test_home_in_the_target_path_is_expanded(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    save(tiny, tmp_path / "models" / "x")
    loaded = from_pretrained("~/models/x", dtype="float32")
    assert loaded.path == str(tmp_path / "models" / "x") and loaded.name == loaded.path
    assert loaded.identity.weights_hash == tiny.identity.weights_hash
    meta = from_pretrained("~/models/x", device="meta")
    assert meta.identity == loaded.identity
    with pytest.raises(TargetError, match="does not exist"):
        from_pretrained("~/models/nope")


@pytest.mark.slow
def test_embedded_target_fingerprint_from_files_and_parameters(smollm2):
    """SmolLM2 (tied embeddings): the meta load (files) and the float32 load (parameters)."""
    assert smollm2.config.tie_word_embeddings
    meta = from_pretrained(smollm2.path, device="meta", name=smollm2.name)
    assert meta.identity == smollm2.identity
    bf16 = from_pretrained(smollm2.path, dtype="bfloat16", name=smollm2.name)
    assert bf16.identity == smollm2.identity


def test_load_target_rebuilds_a_tiny_target_from_its_identity():
    from drafters.target import load_target

    deeper = tiny_target(seed=3, num_layers=3, intermediate_size=96)
    assert load_target(None, deeper.identity.to_dict()).identity == deeper.identity
    assert load_target(None, legacy(deeper.identity)).name == deeper.name  # older: defaults
