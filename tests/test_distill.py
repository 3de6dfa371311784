import json

import pytest

import drafters.data.distillation as D
from drafters.data.corpus import DistillResumeError, finalize, load_distilled
from drafters.data.distillation import DistillConfig


def make_source(path, n=7):
    rows = []
    for i in range(n):
        turns = [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "old"}]
        if i % 2:
            turns += [{"from": "human", "value": f"follow-up {i}"}, {"from": "gpt", "value": "x"}]
        rows.append({"id": f"c{i}", "conversations": turns})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


CFG = DistillConfig(max_new_tokens=6, batch_size=3)


def dataset_rows(out):
    ds, meta = load_distilled(out)
    return ds.to_list(), meta


def test_turns_are_regenerated_from_own_answers(tmp_path, chatty):
    tiny = chatty
    src = make_source(tmp_path / "c.jsonl")
    D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None)
    finalize(tmp_path / "out", tiny.identity.to_dict())
    rows, meta = dataset_rows(tmp_path / "out")
    assert [r["id"] for r in rows] == [f"c{i}" for i in range(7)]
    two = rows[1]
    assert [m["role"] for m in two["messages"]] == ["user", "assistant"] * 2
    assert all(m["content"] != "old" for m in two["messages"] if m["role"] == "assistant")
    assert len(two["response_ids"]) == 2 and all(len(x) <= 6 for x in two["response_ids"])
    assert two["finish"][0] == "eos" and set(two["finish"]) <= {"eos", "length"}
    assert meta["target"]["tokenizer_hash"] == tiny.identity.tokenizer_hash
    # the answer text is the decoded token ids; EOS (when present) is the last id
    tok = tiny.tokenizer
    for msg, ids, fin in zip(two["messages"][1::2], two["response_ids"], two["finish"], strict=1):
        body = ids[:-1] if fin == "eos" else ids
        assert msg["content"] == tok.decode(body, skip_special_tokens=True)


def test_killed_run_resumes_to_identical_dataset(tmp_path, tiny, monkeypatch):
    src = make_source(tmp_path / "c.jsonl")
    D.run_distillation(tiny, src, tmp_path / "whole", CFG, split=None)
    finalize(tmp_path / "whole", tiny.identity.to_dict())

    real, calls = D.generate_turns, []

    def dies_on_second_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed mid-run
        return real(*args, **kwargs)

    monkeypatch.setattr(D, "generate_turns", dies_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        D.run_distillation(tiny, src, tmp_path / "resumed", CFG, split=None)
    monkeypatch.setattr(D, "generate_turns", real)
    stats = D.run_distillation(tiny, src, tmp_path / "resumed", CFG, split=None)
    assert stats["batches_resumed"] == 1 and stats["batches"] == 3
    finalize(tmp_path / "resumed", tiny.identity.to_dict())
    assert dataset_rows(tmp_path / "resumed")[0] == dataset_rows(tmp_path / "whole")[0]


def test_growing_the_corpus_reuses_finished_batches(tmp_path, tiny):
    src = make_source(tmp_path / "c.jsonl", n=7)
    D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None, max_conversations=4)
    first = (tmp_path / "out" / "shards" / "batch-000000.json").read_text()
    stats = D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None)
    assert stats["batches_resumed"] == 1  # batch 0 kept; the old partial batch 1 redone
    assert (tmp_path / "out" / "shards" / "batch-000000.json").read_text() == first
    finalize(tmp_path / "out", tiny.identity.to_dict())
    D.run_distillation(tiny, src, tmp_path / "whole", CFG, split=None)
    finalize(tmp_path / "whole", tiny.identity.to_dict())
    assert dataset_rows(tmp_path / "out")[0] == dataset_rows(tmp_path / "whole")[0]
    # shrinking again merges fewer conversations and keeps the other batches for later
    D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None, max_conversations=3)
    _, stats = finalize(tmp_path / "out", tiny.identity.to_dict())
    assert stats["conversations"] == 3
    assert len(list((tmp_path / "out" / "shards").iterdir())) == 3


def test_sharded_distillation_merges_to_the_unsharded_dataset(tmp_path, tiny):
    src = make_source(tmp_path / "c.jsonl", n=7)
    D.run_distillation(tiny, src, tmp_path / "whole", CFG, split=None)
    finalize(tmp_path / "whole", tiny.identity.to_dict())
    D.run_distillation(
        tiny, src, tmp_path / "sharded", CFG, split=None, shard_index=1, num_shards=2
    )
    with pytest.raises(DistillResumeError, match="not distilled yet"):
        finalize(tmp_path / "sharded", tiny.identity.to_dict())  # shard 0 still missing
    D.run_distillation(
        tiny, src, tmp_path / "sharded", CFG, split=None, shard_index=0, num_shards=2
    )
    finalize(tmp_path / "sharded", tiny.identity.to_dict())
    assert dataset_rows(tmp_path / "sharded")[0] == dataset_rows(tmp_path / "whole")[0]
    shards = sorted(p.name for p in (tmp_path / "sharded" / "shards").iterdir())
    assert shards == sorted(p.name for p in (tmp_path / "whole" / "shards").iterdir())


def test_resume_with_other_settings_is_refused(tmp_path, tiny):
    src = make_source(tmp_path / "c.jsonl", n=2)
    D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None)
    other = DistillConfig(max_new_tokens=7, batch_size=3)
    with pytest.raises(DistillResumeError, match="config"):
        D.run_distillation(tiny, src, tmp_path / "out", other, split=None)


@pytest.mark.parametrize("drop", [True, False])
def test_length_cut_answers_end_the_conversation(tmp_path, tiny, drop):
    src = make_source(tmp_path / "c.jsonl", n=4)
    D.run_distillation(tiny, src, tmp_path / "out", DistillConfig(batch_size=4), split=None)
    # hand-written outcomes: c0 ends by EOS; c1 turn 1 EOS, turn 2 cut; c2 cut; c3 both EOS
    shard = tmp_path / "out" / "shards" / "batch-000000.json"
    data = json.loads(shard.read_text())
    finishes = [["eos"], ["eos", "length"], ["length"], ["eos", "eos"]]
    for r, fin in zip(data["records"], finishes, strict=True):
        r["finish"] = fin
        r["response_ids"] = r["response_ids"][:1] * len(fin)
        user = [m for m in r["messages"] if m["role"] == "user"]
        r["messages"] = [
            m for u in user[: len(fin)] for m in (u, {"role": "assistant", "content": "a"})
        ]
    shard.write_text(json.dumps(data))
    _, stats = finalize(tmp_path / "out", tiny.identity.to_dict(), drop_length_cut=drop)
    rows, _ = dataset_rows(tmp_path / "out")
    got = [(r["id"], r["finish"]) for r in rows]
    if drop:
        assert got == [("c0", ["eos"]), ("c1", ["eos"]), ("c3", ["eos", "eos"])]
        assert [m["role"] for m in rows[1]["messages"]] == ["user", "assistant"]
        assert stats["length_cut_turns_dropped"] == 2 and stats["conversations_dropped"] == 1
    else:
        assert got == [(f"c{i}", f) for i, f in enumerate(finishes)]
        assert stats["length_cut_turns_dropped"] == 0 and stats["conversations_dropped"] == 0


def test_generation_stops_a_conversation_at_its_first_length_cut(tiny):
    from drafters.data.sharegpt import Conversation

    msgs = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}) * 3
    conv = Conversation("x", msgs, 0)
    engine = D.make_engine("hf", tiny, 4, 1024 + 2)
    cfg = DistillConfig(max_new_tokens=2)
    keep = D.generate_turns(engine, tiny.tokenizer, [conv], cfg, tiny.eos_token_ids)[0]
    assert keep["finish"] == ["length"] and keep["stopped"] == "length_cut"


def test_dataset_for_another_target_is_refused(tmp_path, tiny):
    from drafters.testing import tiny_target

    src = make_source(tmp_path / "c.jsonl", n=1)
    D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None)
    finalize(tmp_path / "out", tiny.identity.to_dict())
    with pytest.raises(ValueError, match="hidden_size"):
        load_distilled(tmp_path / "out", tiny_target(hidden_size=32).identity)
    with pytest.raises(FileNotFoundError, match="python data/distill.py"):
        load_distilled(tmp_path / "nothing")


def test_dataset_of_another_model_with_the_same_shapes_is_refused(tmp_path, tiny):
    """seed 1 has seed 0's architecture and tokenizer, not its weights: not its corpus."""
    from drafters.testing import tiny_target

    src = make_source(tmp_path / "c.jsonl", n=1)
    D.run_distillation(tiny, src, tmp_path / "out", CFG, split=None)
    finalize(tmp_path / "out", tiny.identity.to_dict())
    seed1 = tiny_target(seed=1)
    with pytest.raises(ValueError, match="weights_hash") as e:
        load_distilled(tmp_path / "out", seed1.identity)
    assert tiny.name in str(e.value) and seed1.name in str(e.value)
    with pytest.raises(DistillResumeError, match="weights_hash"):
        D.run_distillation(seed1, src, tmp_path / "out", CFG, split=None)
    # a dataset finalized by older code (identity without the fingerprint): on its keys + name
    from drafters.target_identity import LEGACY_KEYS

    old = {k: tiny.identity.to_dict()[k] for k in LEGACY_KEYS}
    finalize(tmp_path / "out", old)
    load_distilled(tmp_path / "out", tiny.identity)
    with pytest.raises(ValueError, match="name: .*seed0.*seed1"):
        load_distilled(tmp_path / "out", seed1.identity)


def test_manifest_with_an_older_identity_resumes(tmp_path, tiny):
    """A manifest written before the weights fingerprint ({name, hidden_size, vocab_size,
    tokenizer_hash}) resumes with the same model, keeping its entry; another name or
    tokenizer is refused."""
    from drafters.target_identity import LEGACY_KEYS
    from drafters.testing import tiny_target

    src = make_source(tmp_path / "c.jsonl", n=4)
    out = tmp_path / "out"
    D.run_distillation(tiny, src, out, CFG, split=None, max_conversations=3)
    manifest = json.loads((out / "manifest.json").read_text())
    old = {k: manifest["target"][k] for k in LEGACY_KEYS}
    manifest["target"] = old
    (out / "manifest.json").write_text(json.dumps(manifest))
    stats = D.run_distillation(tiny, src, out, CFG, split=None)  # grows: one more batch
    assert stats["batches_resumed"] == 1 and stats["batches"] == 2
    assert json.loads((out / "manifest.json").read_text())["target"] == old
    finalize(out, old)
    load_distilled(out, tiny.identity)

    for other, field in (({**old, "name": "another-model"}, "name"), (old, "tokenizer_hash")):
        manifest["target"] = other
        (out / "manifest.json").write_text(json.dumps(manifest))
        target = tiny
        if field == "tokenizer_hash":
            target = tiny_target(seed=0)
            target.tokenizer.add_tokens(["<|extra|>"])
        with pytest.raises(
            DistillResumeError, match=f"(?s)settings \\(target\\).*\n  {field}: distillation "
        ):
            D.run_distillation(target, src, out, CFG, split=None)


@pytest.mark.slow
def test_end_to_end_with_the_embedded_target(tmp_path):
    """`python data/distill.py` as a user runs it, on real ShareGPT with real SmolLM2."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "distilled"
    cmd = [
        sys.executable,
        str(root / "data" / "distill.py"),
        "max_conversations=3",
        "generation.max_new_tokens=24",
        "generation.max_turns=2",
        "generation.batch_size=3",
        f"out_dir={out}",
        f"paths.log_dir={tmp_path / 'logs'}",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tokens_per_s_this_run" in res.stdout
    rows, meta = dataset_rows(out)
    assert len(rows) == 3
    assert meta["target"]["name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["stats"]["run"]["read"]["skipped"]["truncated_tail"] == 0  # stopped before the cut
    first = rows[0]["messages"]
    assert first[0]["role"] == "user" and first[1]["role"] == "assistant" and first[1]["content"]


@pytest.mark.parametrize(
    "env, shard",
    [
        ({}, (0, 1)),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_NTASKS": "1"}, (3, 8)),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, (1, 2)),  # one shard per srun rank
    ],
)
def test_shard_comes_from_the_slurm_array_task_or_rank(env, shard, monkeypatch):
    from train_helpers import compose_config

    for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = compose_config("distill", [])
    assert (cfg.shard.index, cfg.shard.count) == shard


def test_fast_hf_path_gives_the_plain_paths_dataset(tmp_path, chatty):
    """backend=hf_fast (in-place KV slots, finished rows refilled) == backend=hf, same dtype;
    batch 3 over 7 conversations with follow-up turns, so slots are freed and refilled."""
    src = make_source(tmp_path / "c.jsonl", n=7)
    for backend in ("hf", "hf_fast"):
        cfg = DistillConfig(backend=backend, max_new_tokens=6, batch_size=3, batch_conversations=7)
        D.run_distillation(chatty, src, tmp_path / backend, cfg, split=None)
        finalize(tmp_path / backend, chatty.identity.to_dict())
    plain, fast = (dataset_rows(tmp_path / b)[0] for b in ("hf", "hf_fast"))
    assert plain == fast and any(len(r["finish"]) == 2 for r in plain)
    assert dataset_rows(tmp_path / "hf_fast")[1]["distill"]["engine"]["engine"] == "hf_fast"


@pytest.mark.slow
def test_fast_hf_path_equals_hf_generate_on_the_embedded_target(smollm2):
    """Real ShareGPT first turns of different lengths, batch 3 of 8 requests: every answer of
    the slot engine equals HF `generate`'s, token for token, in fp32. (Not in bf16: there
    the two differed on these prompts; each row's rounding depends on its batch's shape.)"""

    from drafters.data.chat import render_prompt
    from drafters.data.engines import Request, SamplingConfig, make_engine
    from drafters.data.sharegpt import read_conversations

    target = smollm2
    convs = list(read_conversations("sharegpt-package", split="train", limit=12))
    prompts = [render_prompt(target.tokenizer, [c.messages[0]]) for c in convs]
    prompts = [p for p in prompts if len(p) <= 400][:8]
    sampling = SamplingConfig(max_new_tokens=24, stop_token_ids=tuple(target.eos_token_ids))
    answers = {}
    for backend in ("hf", "hf_fast"):
        got = answers[backend] = {}
        engine = make_engine(backend, target, 3, 400 + 24)
        requests = [Request(str(i), p) for i, p in enumerate(prompts)]
        engine.run(requests, sampling, lambda r, ids, fin, got=got: got.update({r.id: ids}) or [])
    assert answers["hf"] == answers["hf_fast"] and len(answers["hf"]) == len(prompts)


def test_vllm_runtime_settings_do_not_block_a_resume():
    """Where vLLM's Python lives and its cache size change no output: a resume may differ in
    them. What changes outputs (eager mode, batch size, the engine) must match."""
    base = dict(backend="vllm", vllm={"python": "/a", "kv_cache_gib": 2, "enforce_eager": False})
    a = DistillConfig(**base)
    b = DistillConfig(
        backend="vllm", vllm={"python": "/b", "kv_cache_gib": 8, "enforce_eager": False}
    )
    assert a.settings() == b.settings() and a.fingerprint() == b.fingerprint()
    assert DistillConfig(**{**base, "vllm": {"enforce_eager": True}}).settings() != a.settings()
    assert DistillConfig(**{**base, "batch_size": 64}).fingerprint() != a.fingerprint()
    assert "vllm" not in DistillConfig(backend="hf_fast", vllm={"python": "/a"}).settings()


def test_the_config_file_and_the_dataclass_agree_on_every_default():
    from dataclasses import asdict

    from omegaconf import OmegaConf
    from train_helpers import ROOT

    yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/distill.yaml").generation)
    assert yaml == asdict(DistillConfig())
