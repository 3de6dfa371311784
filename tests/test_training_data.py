import pytest
import torch

from drafters.testing import tiny_target
from drafters.training.datamodule import DistilledDataModule
from drafters.training.examples import ConversationExamples, LengthBucketBatchSampler
from drafters.training.feature_cache import build_feature_cache
from drafters.training.feature_store import FeatureCache, FeatureCacheError


def examples_of(target, dataset_dir, max_length=64):
    from drafters.data.corpus import load_distilled

    ds, _ = load_distilled(dataset_dir, target.identity)
    return ConversationExamples(ds.to_list(), target.tokenizer, max_length, target.eos_token_ids)


def test_sampler_is_deterministic_resumable_and_rank_sharded():
    lengths = [(i * 37) % 50 + 1 for i in range(103)]
    s = LengthBucketBatchSampler(lengths, batch_size=4, seed=3, pool_batches=4)
    s.set_epoch(2)
    full = list(s)
    assert full == list(s)  # same epoch, same order
    s.set_epoch(3)
    assert list(s) != full  # reshuffled per epoch
    resumed = LengthBucketBatchSampler(lengths, batch_size=4, seed=3, pool_batches=4)
    resumed.set_epoch(2)
    resumed.start_batch = 5
    assert list(resumed) == full[5:] and len(resumed) == len(full) - 5
    resumed.set_epoch(3)  # next epoch starts from its first batch again
    assert len(list(resumed)) == len(full)
    ranks = [LengthBucketBatchSampler(lengths, 4, seed=3, rank=r, world_size=2) for r in (0, 1)]
    a, b = (list(r) for r in ranks)
    assert len(a) == len(b)
    flat_a, flat_b = {i for x in a for i in x}, {i for x in b for i in x}
    assert not flat_a & flat_b


def test_buckets_cut_padding():
    lengths = [1 + (i * 7919) % 500 for i in range(512)]
    bucketed = LengthBucketBatchSampler(lengths, 8, seed=0, pool_batches=64)
    plain = LengthBucketBatchSampler(lengths, 8, seed=0, pool_batches=1)

    def pad(s):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in s)

    assert pad(bucketed) < 0.2 * pad(plain)


def test_offline_cache_equals_online_features(tmp_path, tiny, tiny_distilled):
    ex = examples_of(tiny, tiny_distilled)
    meta = build_feature_cache(
        tiny, ex, tmp_path / "cache", dtype="float32", batch_size=3, shard_examples=5
    )
    assert meta["bytes_per_token"] == pytest.approx(4 * tiny.hidden_size, rel=0.05)
    cache = FeatureCache(tmp_path / "cache", tiny, ex)
    for e in list(ex)[:6]:
        online, _ = tiny.features(torch.tensor([e.input_ids]))
        torch.testing.assert_close(cache[e.key], online[0], atol=1e-5, rtol=1e-4)


def test_cache_build_resumes_and_bf16_halves_size(tmp_path, tiny, tiny_distilled):
    ex = examples_of(tiny, tiny_distilled)
    build_feature_cache(tiny, ex, tmp_path / "c", dtype="bfloat16", shard_examples=4)
    first = tmp_path / "c" / "shard-000001.npy"
    first.unlink()  # as if killed before this shard was written
    stamp = (tmp_path / "c" / "shard-000000.npy").stat().st_mtime_ns
    meta = build_feature_cache(tiny, ex, tmp_path / "c", dtype="bfloat16", shard_examples=4)
    assert first.exists()
    assert (tmp_path / "c" / "shard-000000.npy").stat().st_mtime_ns == stamp  # not redone
    assert meta["bytes_per_token"] == pytest.approx(2 * tiny.hidden_size, rel=0.05)
    e = ex[0]
    online, _ = tiny.features(torch.tensor([e.input_ids]))
    cached = FeatureCache(tmp_path / "c", tiny, ex)[e.key]
    assert cached.dtype == torch.bfloat16
    torch.testing.assert_close(cached.float(), online[0], atol=2e-2, rtol=2e-2)


def test_a_cache_built_in_two_parts_equals_one_built_whole(tmp_path, tiny, tiny_distilled):
    ex = examples_of(tiny, tiny_distilled)
    whole = build_feature_cache(tiny, ex, tmp_path / "whole", dtype="float32", shard_examples=4)
    build_feature_cache(tiny, ex, tmp_path / "p", dtype="float32", shard_examples=4, part=(1, 2))
    with pytest.raises(FeatureCacheError, match="lacks"):
        FeatureCache(tmp_path / "p", tiny, ex)  # part 0 not built yet
    build_feature_cache(tiny, ex, tmp_path / "p", dtype="float32", shard_examples=4, part=(0, 2))
    numbers = [int(p.stem.split("-")[1]) for p in (tmp_path / "p").glob("shard-*.json")]
    assert {n % 2 for n in numbers} == {0, 1}  # each part writes its own shard numbers
    final = build_feature_cache(tiny, ex, tmp_path / "p", dtype="float32", shard_examples=4)
    assert final["this_build"]["added"] == 0 and final["num_tokens"] == whole["num_tokens"]
    a, b = FeatureCache(tmp_path / "whole", tiny, ex), FeatureCache(tmp_path / "p", tiny, ex)
    for e in ex:
        torch.testing.assert_close(a[e.key], b[e.key], atol=1e-5, rtol=1e-4)
    with pytest.raises(FeatureCacheError, match="part 2/2"):
        build_feature_cache(tiny, ex, tmp_path / "p", part=(2, 2))


def test_aux_features_are_added_to_an_existing_cache_and_read_wide(tmp_path, tiny, tiny_distilled):
    """EAGLE-3's aux layers: a build with them adds the aux files to the shards an earlier
    build wrote (f untouched), new shards get them too, reads are [f ; h_1] as online, and a
    cache without them or with other layers is refused, saying how to fix it."""
    ex = examples_of(tiny, tiny_distilled)
    half = list(ex)[: len(ex) // 2]
    build_feature_cache(tiny, half, tmp_path / "c", dtype="float32", shard_examples=4)
    with pytest.raises(FeatureCacheError, match="lacks aux features"):
        FeatureCache(tmp_path / "c", tiny, half, aux_layers=(1,))
    first = tmp_path / "c" / "shard-000000.npy"
    stamp = first.stat().st_mtime_ns
    meta = build_feature_cache(
        tiny, ex, tmp_path / "c", dtype="float32", shard_examples=4, aux_layers=(1,)
    )
    assert first.stat().st_mtime_ns == stamp  # f not rewritten
    assert meta["aux_layers"] == [1] and meta["aux_added"]["shards"] > 0
    assert meta["this_build"]["added"] == len(ex) - len(half)
    shards = list((tmp_path / "c").glob("shard-*.json"))
    assert all(p.with_suffix(".aux.npy").exists() for p in shards)
    cache = FeatureCache(tmp_path / "c", tiny, ex, aux_layers=(1,))
    for e in (ex[0], ex[len(ex) - 1]):  # an old shard's example and a new one's
        online, _ = tiny.features(torch.tensor([e.input_ids]), aux_layers=(1,))
        assert cache[e.key].shape == (len(e.input_ids), 2 * tiny.hidden_size)
        torch.testing.assert_close(cache[e.key], online[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(FeatureCache(tmp_path / "c", tiny, ex)[ex[0].key],
                               cache[ex[0].key][:, : tiny.hidden_size])  # fmt: skip
    with pytest.raises(FeatureCacheError, match=r"holds aux layers \[1\], not \[0, 1\]"):
        FeatureCache(tmp_path / "c", tiny, ex, aux_layers=(0, 1))
    with pytest.raises(FeatureCacheError, match=r"holds aux layers \[1\]"):
        build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32", aux_layers=(2,))
    with pytest.raises(ValueError, match=r"aux layers \[2\] are outside 1 .. 1"):
        tiny.features(torch.tensor([ex[0].input_ids]), aux_layers=(2,))


def test_cache_for_another_tokenizer_or_data_is_refused(tmp_path, tiny, tiny_distilled):
    ex = examples_of(tiny, tiny_distilled)
    build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32")
    other = tiny_target(seed=0)
    other.tokenizer.add_tokens(["<extra>"])
    other._identity = None
    with pytest.raises(FeatureCacheError, match="tokenizer_hash"):
        FeatureCache(tmp_path / "c", other, ex)
    cut = examples_of(tiny, tiny_distilled, max_length=60)  # the same keys, cut shorter
    full = {e.key: len(e.input_ids) for e in ex}
    assert len(cut) and any(len(c.input_ids) != full[c.key] for c in cut)
    with pytest.raises(FeatureCacheError, match="other examples"):
        FeatureCache(tmp_path / "c", tiny, cut)


def test_data_of_another_model_with_the_same_shapes_is_refused(tmp_path, tiny, tiny_distilled):
    """seed 1 shares seed 0's architecture and tokenizer, not its weights: training on seed 1
    refuses seed 0's corpus and feature cache, naming both targets."""
    seed1 = tiny_target(seed=1)
    dm = DistilledDataModule(str(tiny_distilled), max_length=64, val_fraction=0.25)
    with pytest.raises(ValueError, match="weights_hash") as e:
        dm.attach(seed1).setup()
    assert tiny.name in str(e.value) and seed1.name in str(e.value)

    ex = examples_of(tiny, tiny_distilled)
    build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32")
    with pytest.raises(FeatureCacheError, match="weights_hash") as e:
        FeatureCache(tmp_path / "c", seed1, ex)
    assert tiny.name in str(e.value) and seed1.name in str(e.value)
    with pytest.raises(FeatureCacheError, match="weights_hash"):
        build_feature_cache(seed1, ex, tmp_path / "c", dtype="float32")


def test_cache_with_an_older_identity_still_loads(tmp_path, tiny, tiny_distilled):
    """A cache whose meta holds an identity written before the fingerprint: compared on the
    keys it has and the name; reads and resumes with the right target."""
    import json

    from drafters.target_identity import LEGACY_KEYS

    ex = examples_of(tiny, tiny_distilled)
    build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32", shard_examples=4)
    meta_path = tmp_path / "c" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["target"] = {k: meta["target"][k] for k in LEGACY_KEYS}
    meta_path.write_text(json.dumps(meta))
    FeatureCache(tmp_path / "c", tiny, ex)
    (tmp_path / "c" / "shard-000001.npy").unlink()
    build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32", shard_examples=4)
    assert (tmp_path / "c" / "shard-000001.npy").exists()
    meta["target"]["name"] = "another-model"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FeatureCacheError, match="name: .*'another-model'"):
        FeatureCache(tmp_path / "c", tiny, ex)


def test_online_and_offline_batches_are_identical(tmp_path, tiny, tiny_distilled):
    online = DistilledDataModule(
        str(tiny_distilled), max_length=64, batch_size=3, val_fraction=0.25
    ).attach(tiny)
    online.setup()
    build_feature_cache(tiny, online.train_set, tmp_path / "cache" / "train", dtype="float32")
    offline = DistilledDataModule(
        str(tiny_distilled),
        max_length=64,
        batch_size=3,
        val_fraction=0.25,
        features="offline",
        cache_dir=str(tmp_path / "cache"),
    ).attach(tiny)
    offline.setup()
    a, b = next(iter(online.train_dataloader())), next(iter(offline.train_dataloader()))
    for k in ("input_ids", "attention_mask", "loss_mask"):
        assert torch.equal(a[k], b[k])
    f, _ = tiny.features(a["input_ids"], a["attention_mask"])
    m = a["attention_mask"].bool()
    torch.testing.assert_close(b["features"][m], f[m], atol=1e-5, rtol=1e-4)
    assert len(online.val_set) > 0 and len(online.train_set) > len(online.val_set)


def test_missing_dataset_says_how_to_make_it(tmp_path, tiny):
    dm = DistilledDataModule(str(tmp_path / "none"), distill_command="python data/distill.py X")
    with pytest.raises(FileNotFoundError, match="python data/distill.py X"):
        dm.attach(tiny).setup()


def test_a_cut_answer_keeps_its_tokens_and_no_end_of_turn(tiny):
    tok = tiny.tokenizer
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "cut off her"}]
    body = tok("cut off her", add_special_tokens=False)["input_ids"]
    rows = {
        fin: {"key": "a", "messages": msgs, "finish": [fin], "response_ids": [ids]}
        for fin, ids in (("eos", body + [tok.eos_token_id]), ("length", body))
    }
    whole, cut = (
        ConversationExamples([rows[f]], tok, 256, tiny.eos_token_ids)[0] for f in ("eos", "length")
    )
    trained = [t for t, m in zip(cut.input_ids, cut.loss_mask, strict=True) if m]
    assert trained == body  # the target never said end-of-turn there
    assert [t for t, m in zip(whole.input_ids, whole.loss_mask, strict=True) if m] == (
        body + [tok.eos_token_id]
    )


def test_a_small_set_still_holds_out_one_conversation(tiny, tiny_distilled):
    dm = DistilledDataModule(str(tiny_distilled), max_length=64, val_fraction=1e-6).attach(tiny)
    dm.setup()
    assert len(dm.val_set) == 1 and len(dm.train_set) == 23


def test_cache_features_job_takes_its_part_from_the_config(tmp_path, tiny_distilled, capsys):
    """`python data/cache_features.py features_part=i/n` as composed by Hydra."""
    from train_helpers import compose_config, tiny_overrides

    from drafters.training.feature_cache import cache_features

    over = tiny_overrides(tmp_path, tiny_distilled, "data.features=offline")
    with pytest.raises(FeatureCacheError, match="write it i/n"):
        cache_features(compose_config("train", [*over, "features_part=2"]))
    first = cache_features(compose_config("train", [*over, "features_part=0/2"]))
    assert "features 0/2" in capsys.readouterr().err
    cache_features(compose_config("train", [*over, "features_part=1/2"]))
    whole = cache_features(compose_config("train", over))
    assert whole["train"]["this_build"]["added"] == 0
    assert first["train"]["num_examples"] < whole["train"]["num_examples"]
