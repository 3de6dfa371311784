"""The committed copy of a distilled corpus (drafters/data/reference.py): published batch files
rebuild the same dataset on another machine without generating, and only a copy made alike is
used."""

import json

import pytest
from test_distill import CFG, dataset_rows, make_source

import drafters.data.distillation as D
from drafters.data.corpus import finalize
from drafters.data.distillation import DistillConfig
from drafters.data.reference import publish, restore


def no_generation(*args, **kwargs):
    raise AssertionError("a batch was generated although the reference holds it")


def test_published_corpus_restores_to_the_same_dataset_without_generating(
    tmp_path, tiny, monkeypatch
):
    src = make_source(tmp_path / "c.jsonl", n=7)
    D.run_distillation(tiny, src, tmp_path / "made", CFG, split=None)
    finalize(tmp_path / "made", tiny.identity.to_dict())
    summary = publish(tmp_path / "made", tmp_path / "ref")
    assert summary["batch_files"] == summary["batch_files_total"] == 3
    assert summary["conversations"] == 7 and summary["answer_tokens"] > 0
    from drafters.machine import describe

    assert summary["batch_files_by_machine"] == {describe(): 3}  # each batch file says where
    assert sorted(p.name for p in (tmp_path / "ref").glob("batch-*")) == [
        f"batch-{b:06d}.json.xz" for b in range(3)
    ]

    monkeypatch.setattr(D, "generate_turns", no_generation)
    stats = D.run_distillation(
        tiny, src, tmp_path / "clone", CFG, split=None, reference_dir=tmp_path / "ref"
    )
    assert stats["batches_resumed"] == 3 and stats["generated_tokens_this_run"] == 0
    finalize(tmp_path / "clone", tiny.identity.to_dict())
    assert dataset_rows(tmp_path / "clone")[0] == dataset_rows(tmp_path / "made")[0]
    # the engine that made the copy is recorded, so a resume with another one is refused
    made = json.loads((tmp_path / "made" / "manifest.json").read_text())
    clone = json.loads((tmp_path / "clone" / "manifest.json").read_text())
    assert clone["engine"] == made["engine"]


def test_a_partial_copy_is_restored_and_the_rest_generated(tmp_path, tiny, monkeypatch):
    src = make_source(tmp_path / "c.jsonl", n=7)
    D.run_distillation(tiny, src, tmp_path / "whole", CFG, split=None)
    finalize(tmp_path / "whole", tiny.identity.to_dict())
    D.run_distillation(tiny, src, tmp_path / "part", CFG, split=None, max_conversations=3)
    publish(tmp_path / "part", tmp_path / "ref")  # batch 0 of the whole run

    real, generated = D.generate_turns, []

    def counting(engine, tok, batch, *args):
        generated.append([c.key for c in batch])
        return real(engine, tok, batch, *args)

    monkeypatch.setattr(D, "generate_turns", counting)
    stats = D.run_distillation(
        tiny, src, tmp_path / "out", CFG, split=None, reference_dir=tmp_path / "ref"
    )
    assert stats["batches_resumed"] == 1 and len(generated) == 2
    finalize(tmp_path / "out", tiny.identity.to_dict())
    assert dataset_rows(tmp_path / "out")[0] == dataset_rows(tmp_path / "whole")[0]
    # publishing again adds the new batch files and keeps the old one byte for byte
    first = (tmp_path / "ref" / "batch-000000.json.xz").read_bytes()
    assert publish(tmp_path / "out", tmp_path / "ref")["batch_files"] == 3
    assert (tmp_path / "ref" / "batch-000000.json.xz").read_bytes() == first


def test_a_copy_made_with_other_settings_is_not_used(tmp_path, tiny, capsys):
    src = make_source(tmp_path / "c.jsonl", n=4)
    D.run_distillation(tiny, src, tmp_path / "made", CFG, split=None)
    publish(tmp_path / "made", tmp_path / "ref")
    other = DistillConfig(max_new_tokens=5, batch_size=3)
    stats = D.run_distillation(
        tiny, src, tmp_path / "out", other, split=None, reference_dir=tmp_path / "ref"
    )
    assert stats["batches_resumed"] == 0
    assert "not used: other settings: config" in capsys.readouterr().out
    with pytest.raises(ValueError, match="another distillation"):
        publish(tmp_path / "out", tmp_path / "ref")


def test_a_copy_for_another_target_is_not_used(tmp_path, tiny, capsys):
    from drafters.testing import tiny_target

    src = make_source(tmp_path / "c.jsonl", n=4)
    D.run_distillation(tiny, src, tmp_path / "made", CFG, split=None)
    publish(tmp_path / "made", tmp_path / "ref")
    manifest = json.loads((tmp_path / "made" / "manifest.json").read_text())
    manifest["target"] = tiny_target(seed=1).identity.to_dict()  # same shapes, other weights
    assert restore(tmp_path / "ref", tmp_path / "out", manifest) == 0
    assert "not used" in capsys.readouterr().out
    assert not (tmp_path / "out" / "shards").exists()


def test_merge_alone_rebuilds_the_dataset_from_the_copy(tmp_path, tiny):
    """stage=merge on a fresh clone: no manifest, no batch files, only the committed copy."""
    src = make_source(tmp_path / "c.jsonl", n=5)
    D.run_distillation(tiny, src, tmp_path / "made", CFG, split=None)
    finalize(tmp_path / "made", tiny.identity.to_dict())
    publish(tmp_path / "made", tmp_path / "ref")
    assert restore(tmp_path / "ref", tmp_path / "fresh") == 2
    manifest = json.loads((tmp_path / "fresh" / "manifest.json").read_text())
    finalize(tmp_path / "fresh", manifest["target"])
    assert dataset_rows(tmp_path / "fresh")[0] == dataset_rows(tmp_path / "made")[0]
