"""Training to a budget that fits the data: data subsets, the warmup share, the precision choice,
best-checkpoint choice on the acceptance estimate, the exported drafter and its W&B artifact,
the accuracy metrics only on logging steps, and merging a corpus that is still being made."""

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from test_training_data import examples_of
from train_helpers import compose_config, tiny_overrides

from drafters.training.feature_cache import build_feature_cache
from drafters.training.feature_store import FeatureCache, FeatureCacheError
from drafters.training.module import DrafterLitModule
from drafters.training.precision import resolve_precision
from drafters.training.run import train


def test_answer_token_subsets_are_nested_and_read_the_parent_cache(tmp_path, tiny, tiny_distilled):
    ex = examples_of(tiny, tiny_distilled)
    small, large = ex.subset_by_answer_tokens(60), ex.subset_by_answer_tokens(200)
    assert 0 < small.num_answer_tokens <= 60 and large.num_answer_tokens <= 200
    assert large.examples[: len(small)] == small.examples  # a prefix of the same order
    assert len(ex.subset_by_answer_tokens(1)) == 1  # at least one example
    assert ex.subset_by_answer_tokens(10**9).num_answer_tokens == ex.num_answer_tokens
    build_feature_cache(tiny, ex, tmp_path / "cache", dtype="float32")
    cache = FeatureCache(tmp_path / "cache", tiny, small)  # the full set's cache serves it
    assert cache[small.examples[0].key].shape[0] == len(small.examples[0].input_ids)


def test_a_budgeted_cache_holds_only_its_subset_and_grows_to_a_larger_one(
    tmp_path, tiny, tiny_distilled
):
    """`python data/cache_features.py data.max_train_tokens=N`: the subset's training examples
    and all of validation; a smaller budget reads it, the whole corpus is told it lacks some."""
    from hydra.utils import instantiate

    from drafters.training.feature_cache import cache_features

    def config(*extra):
        return compose_config(
            "train", tiny_overrides(tmp_path, tiny_distilled, "data.features=offline", *extra)
        )

    def data(*extra):
        dm = instantiate(config(*extra).data).attach(tiny)
        dm.setup()
        return dm

    budget = cache_features(config("data.max_train_tokens=200"))
    full, smaller = data(), data("data.max_train_tokens=60")
    assert budget["train"]["num_examples"] < len(full.train_set)
    assert budget["validation"]["num_examples"] == len(full.val_set)
    FeatureCache(smaller.cache_folder("train"), tiny, smaller.train_set)  # served
    with pytest.raises(FeatureCacheError, match="smaller data.max_train_tokens"):
        FeatureCache(full.cache_folder("train"), tiny, full.train_set)
    whole = cache_features(config())  # adds only the rest
    added = whole["train"]["this_build"]["added"]
    assert added == len(full.train_set) - budget["train"]["num_examples"]
    FeatureCache(full.cache_folder("train"), tiny, full.train_set)


def test_max_train_tokens_cuts_training_not_validation(tmp_path, tiny_distilled):
    from hydra.utils import instantiate

    from drafters.testing import tiny_target

    base = compose_config("train", tiny_overrides(tmp_path, tiny_distilled))
    cut = compose_config("train", tiny_overrides(tmp_path, tiny_distilled,
                                                 "data.max_train_tokens=100"))  # fmt: skip
    full_dm = instantiate(base.data).attach(tiny_target())
    cut_dm = instantiate(cut.data).attach(tiny_target())
    full_dm.setup(), cut_dm.setup()
    assert cut_dm.train_set.num_answer_tokens <= 100 < full_dm.train_set.num_answer_tokens
    assert [e.key for e in cut_dm.val_set] == [e.key for e in full_dm.val_set]
    assert int(cut_dm.token_counts().sum()) == cut_dm.train_set.num_answer_tokens
    with pytest.raises(Exception, match="max_train_tokens=0: use a positive count"):
        instantiate(cut.data, max_train_tokens=0)


def test_warmup_ratio_sizes_the_warmup_by_the_run():
    from drafters.training.module import WarmupDecay

    m = DrafterLitModule("medusa", {"hidden_size": 8, "vocab_size": 16},
                         optim={"warmup_steps": None, "warmup_ratio": 0.1})  # fmt: skip

    class T:
        estimated_stepping_batches = 95

    m._trainer = T()  # configure_optimizers reads the run's total steps only
    sched = m.configure_optimizers()["lr_scheduler"]["scheduler"]
    (fn,) = sched.lr_lambdas
    assert isinstance(fn, WarmupDecay) and fn.warmup == 10  # ceil(0.1 * 95)


def test_precision_auto_is_measured_and_other_values_pass_through():
    assert resolve_precision("32-true") == "32-true"
    assert resolve_precision("bf16-mixed") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") in ("32-true", "bf16-mixed")


def test_best_checkpoint_export_and_wandb_artifact(tmp_path, tiny_distilled, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    over = tiny_overrides(
        tmp_path, tiny_distilled, "drafter=medusa", "logger=wandb", "trainer.max_steps=4",
        "trainer.val_check_interval=1", "drafter.model.draft_vocab_size=32",
    )  # fmt: skip
    cfg = compose_config("train", over)
    train(cfg)  # finishes its W&B run: the offline run folder is complete
    run_dir = Path(cfg.run_dir)
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    scores = [
        float(r["val/accept_len_est"])
        for r in __import__("csv").DictReader(open(run_dir / "csv" / "metrics.csv"))
        if r.get("val/accept_len_est")
    ]
    state = next(s for s in best["callbacks"].values() if s.get("monitor") == "val/accept_len_est")
    assert float(state["best_model_score"]) == pytest.approx(max(scores), abs=1e-6)
    exported = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert exported["source"]["checkpoint"].endswith("best.ckpt")
    assert exported["source"]["global_step"] == best["global_step"]
    ended = json.loads((run_dir / "fit_end.json").read_text())  # the cap ended it, not the rule
    assert ended["ended_by"] == "max_steps" and ended["global_step"] == 4 and ended["epochs"] > 0
    assert ended["precision"] in ("32-true", "bf16-mixed") and ended["machine"]
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    # the artifact is in the offline run. wandb-core's service process writes the .wandb file
    # and may close it just after finish() returns: on a loaded machine CI once read only its
    # header, so give the writer a few seconds
    name, deadline = f"{cfg.run_name}-drafter".encode(), time.monotonic() + 30
    while name not in next(offline.glob("*.wandb")).read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert name in next(offline.glob("*.wandb")).read_bytes()
    import wandb

    assert wandb.run is None  # the next train() in this process starts a W&B run of its own


def test_accuracy_metrics_only_on_logging_steps(tmp_path, tiny_distilled):
    over = tiny_overrides(tmp_path, tiny_distilled, "drafter=falcon", "trainer.max_steps=4",
                          "trainer.log_every_n_steps=2")  # fmt: skip
    cfg = compose_config("train", over)
    train(cfg)
    rows = list(__import__("csv").DictReader(open(Path(cfg.run_dir) / "csv" / "metrics.csv")))
    train_rows = [r for r in rows if r.get("train/loss")]
    assert [int(r["step"]) for r in train_rows] == [1, 3]  # Lightning logs steps 2 and 4
    assert all(r["train/acc_pos1"] and r["train/tokens_per_s"] for r in train_rows)


def test_a_run_that_the_early_stopping_rule_ends_says_so(tmp_path, tiny_distilled):
    """fit_end.json tells a converged run (the rule ended it) from a capped one: here no
    validation after the first improves by min_delta, so patience 1 stops it at step 2."""
    over = tiny_overrides(
        tmp_path, tiny_distilled, "drafter=medusa", "trainer.max_steps=50",
        "trainer.val_check_interval=1", "callbacks.early_stopping.patience=1",
        "callbacks.early_stopping.min_delta=100", "drafter.model.draft_vocab_size=32",
    )  # fmt: skip
    cfg = compose_config("train", over)
    train(cfg)
    ended = json.loads((Path(cfg.run_dir) / "fit_end.json").read_text())
    assert ended["ended_by"] == "early_stopping" and ended["reason"] == "patience_exhausted"
    assert ended["global_step"] == 2


def test_partial_merge_of_a_corpus_still_being_made(tmp_path, tiny, tiny_distilled):
    from drafters.data.corpus import DistillResumeError, finalize, load_records

    corpus = tmp_path / "train"
    shutil.copytree(tiny_distilled, corpus, ignore=shutil.ignore_patterns("dataset"))
    shards = sorted((corpus / "shards").glob("batch-*.json"))
    assert len(shards) > 1
    all_records = load_records(corpus)
    shards[-1].unlink()  # this batch is not distilled yet
    with pytest.raises(DistillResumeError, match="not distilled yet"):
        finalize(corpus, tiny.identity.to_dict())
    ds, stats = finalize(corpus, tiny.identity.to_dict(), partial=True)
    assert 0 < len(ds) < len(all_records)
    assert stats["partial"]["batches_merged"] == len(shards) - 1
    assert stats["partial"]["batches_total"] == len(shards)


def test_cache_stores_the_target_entropy_once(tmp_path, tiny, tiny_distilled):
    from drafters.models.gate import entropy
    from drafters.training.examples import collate

    ex = examples_of(tiny, tiny_distilled)
    build_feature_cache(tiny, ex, tmp_path / "cache", dtype="bfloat16", shard_examples=5)
    cache = FeatureCache(tmp_path / "cache", tiny, ex)
    e = ex.examples[0]
    f, _ = tiny.features(torch.tensor([e.input_ids]))
    torch.testing.assert_close(cache.entropy(e.key), entropy(tiny.lm_head(f[0])), atol=1e-4,
                               rtol=1e-4)  # fmt: skip
    batch = collate(ex.examples[:2], 0, [cache[x.key] for x in ex.examples[:2]],
                    [cache.entropy(x.key) for x in ex.examples[:2]])  # fmt: skip
    assert batch["target_entropy"].shape == batch["input_ids"].shape
    for p in (tmp_path / "cache").glob("*.entropy.npy"):  # a shard without it: computed
        p.unlink()
    assert FeatureCache(tmp_path / "cache", tiny, ex).entropy(e.key) is None
    idx = next((tmp_path / "cache").glob("shard-*.json"))
    idx.write_text(json.dumps([[k, n] for k, n, _ in json.loads(idx.read_text())]))
    with pytest.raises(FeatureCacheError, match="older drafters"):  # no digests: unverifiable
        FeatureCache(tmp_path / "cache", tiny, ex)


def test_gate_reads_the_cached_entropy_or_computes_it(tiny):
    from drafters.models.gate import entropy

    shapes = {"hidden_size": tiny.hidden_size, "vocab_size": tiny.vocab_size}
    m = DrafterLitModule("cerberus", shapes, gate="learned").attach(tiny)
    f = torch.randn(2, 5, tiny.hidden_size)
    rows = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    computed = m.target_entropy({}, f, rows)
    want = entropy(tiny.lm_head(f)).masked_fill(~rows, 0)
    torch.testing.assert_close(computed, want)
    cached = m.target_entropy({"target_entropy": want + 1.0}, f, rows)
    torch.testing.assert_close(cached, (want + 1.0).masked_fill(~rows, 0))


def test_a_grown_corpus_adds_only_its_new_examples_to_the_cache(tmp_path, tiny, tiny_distilled):
    import dataclasses

    ex = examples_of(tiny, tiny_distilled)
    half = ex.subset_by_answer_tokens(ex.num_answer_tokens // 2)
    first = build_feature_cache(tiny, half, tmp_path / "c", dtype="float32", shard_examples=4)
    assert first["this_build"]["added"] == len(half)
    with pytest.raises(FeatureCacheError, match=f"lacks {len(ex) - len(half)} of these"):
        FeatureCache(tmp_path / "c", tiny, ex)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "c").glob("shard-*.npy")}
    grown = build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32", shard_examples=4)
    assert grown["this_build"]["added"] == len(ex) - len(half)
    assert grown["num_examples"] == len(ex)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # nothing redone
    build_feature_cache(tiny, ex, tmp_path / "fresh", dtype="float32", shard_examples=4)
    a, b = FeatureCache(tmp_path / "c", tiny, ex), FeatureCache(tmp_path / "fresh", tiny, ex)
    for e in ex:
        assert torch.equal(a[e.key], b[e.key])
    # the same conversations with other answers (another distillation run): refused
    e0 = ex.examples[0]
    other = list(e0.input_ids)
    other[-1] = (other[-1] + 1) % tiny.vocab_size
    changed = dataclasses.replace(e0, input_ids=tuple(other))
    ex.examples[0] = changed
    with pytest.raises(FeatureCacheError, match="other examples"):
        FeatureCache(tmp_path / "c", tiny, ex)
    with pytest.raises(FeatureCacheError, match="other examples"):
        build_feature_cache(tiny, ex, tmp_path / "c", dtype="float32")
