"""Self-distillation: the target regenerates every assistant turn of real conversations.

Turn by turn, each turn conditioned on the target's *own* earlier answers (docs/design.md
section 1), greedy by default, batched with left padding. Work is done in fixed batches of
conversations and each finished batch is written atomically as one shard, so a killed run
restarted with the same command redoes only the unfinished batch: no conversation lost, none
duplicated, and the same batches (hence the same outputs) as an uninterrupted run.
`drafters.data.corpus.finalize` merges the shards into the dataset that training reads.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from drafters.data.chat import render_prompt
from drafters.data.corpus import DistillResumeError, finalize, shard_path
from drafters.data.engines import Engine, Request, SamplingConfig, make_engine
from drafters.data.engines.vllm_client import VLLM_DEFAULTS
from drafters.data.reference import publish, restore
from drafters.data.sharegpt import Conversation, ReadStats, read_conversations
from drafters.io_utils import write_json_atomic
from drafters.machine import describe
from drafters.target import Target
from drafters.target_identity import TargetIdentity


@dataclass(frozen=True)
class DistillConfig:
    """`generation:` in conf/distill.yaml, which documents every field; the defaults here are
    the same (tests/test_distill.py checks it), for code that builds one directly."""

    backend: str = "hf"  # hf | hf_fast | vllm (drafters.data.engines)
    max_new_tokens: int = 256  # per assistant turn
    max_turns: int | None = 2  # user turns per conversation (None: all)
    max_prompt_tokens: int = 1024  # a turn whose prompt is longer ends the conversation there
    batch_size: int = 16  # rows the engine decodes at once
    batch_conversations: int | None = None  # conversations per batch file (None: batch_size)
    pool_batches: int = 16  # batches are cut from pools this many batches long, sorted by length
    do_sample: bool = False  # greedy by default; sampling is a switch
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int = 0
    vllm: dict = field(default_factory=lambda: dict(VLLM_DEFAULTS))  # backend=vllm only

    @property
    def conversations_per_batch(self) -> int:
        return self.batch_conversations or self.batch_size

    def settings(self) -> dict:
        """What a resumed run must agree on to reuse the batches of an earlier one: everything
        but where the vLLM Python lives and how much memory its cache gets (no output changes
        with those), and no vLLM settings at all for the HF engines."""
        payload = {k: v for k, v in self.__dict__.items() if k != "vllm"}
        if self.backend == "vllm":
            runtime = ("python", "kv_cache_gib", "gpu_memory_utilization")
            payload["vllm"] = {k: v for k, v in self.vllm.items() if k not in runtime}
        return payload

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:16]


def _request_seed(cfg: DistillConfig, key: str, turn: int) -> int:
    digest = hashlib.sha256(f"{cfg.seed}/{key}/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def generate_turns(
    engine: Engine, tokenizer, conversations: list[Conversation], cfg: DistillConfig,
    stop_token_ids: list[int],
) -> list[dict]:  # fmt: skip
    """Regenerate the assistant turns of a batch of conversations.

    Each conversation is a chain of requests: turn t+1's prompt is the chat template over the
    conversation so far, with the target's own answers, so it is sent to the engine as soon as
    turn t is done. Returns one record per conversation: the messages with regenerated answers
    (user and system turns kept), the answers' token ids as generated (ending with the
    end-of-turn token when the answer ended by "eos", not when cut by "length").
    """
    records = []
    for conv in conversations:
        users = [m for m in conv.messages if m["role"] == "user"]
        if cfg.max_turns is not None:
            users = users[: cfg.max_turns]
        records.append(
            {
                "id": conv.id,
                "key": conv.key,
                "source_index": conv.source_index,
                "messages": [m for m in conv.messages[:1] if m["role"] == "system"],
                "pending_users": users,
                "response_ids": [],
                "finish": [],
                "stopped": None,
            }
        )
    stop = set(stop_token_ids)

    def next_request(r: dict) -> list[Request]:
        turn = len(r["response_ids"])
        if turn >= len(r["pending_users"]):
            return []
        ids = render_prompt(tokenizer, r["messages"] + [r["pending_users"][turn]])
        if len(ids) > cfg.max_prompt_tokens:
            r["stopped"] = "prompt_too_long"
            return []
        return [Request(f"{r['key']}/{turn}", ids, _request_seed(cfg, r["key"], turn), r)]

    def on_done(req: Request, ids: list[int], finish: str) -> list[Request]:
        r = req.payload
        user = r["pending_users"][len(r["response_ids"])]
        body = ids[:-1] if finish == "eos" and ids and ids[-1] in stop else ids
        text = tokenizer.decode(body, skip_special_tokens=True)
        r["messages"] += [user, {"role": "assistant", "content": text}]
        r["response_ids"].append(list(ids))
        r["finish"].append(finish)
        if finish == "length":  # later turns would build on a truncated answer
            r["stopped"] = "length_cut"
            return []
        return next_request(r)

    first = [q for r in records for q in next_request(r)]
    first.sort(key=lambda q: len(q.prompt))  # less padding for the batched HF engine
    sampling = SamplingConfig(
        max_new_tokens=cfg.max_new_tokens,
        stop_token_ids=tuple(sorted(stop)),
        do_sample=cfg.do_sample,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
    )
    engine.run(first, sampling, on_done)
    for r in records:
        del r["pending_users"]
    return records


def make_batches(conversations: list[Conversation], batch_size: int, pool_batches: int):
    """Fixed batches: the conversations in source order, cut into pools of `pool_batches`
    batches, each pool sorted by the length of its first user turn (less left padding, so far
    fewer wasted FLOPs), then cut into batches. Deterministic, and a larger corpus changes only
    the last pool."""
    pool = batch_size * pool_batches
    batches = []
    for i in range(0, len(conversations), pool):
        chunk = sorted(conversations[i : i + pool], key=_first_prompt_chars)
        batches += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
    return batches


def _first_prompt_chars(conv: Conversation) -> int:
    return sum(len(m["content"]) for m in conv.messages[:2] if m["role"] != "assistant")


def run_distillation(
    target: Target,
    source: str,
    out_dir: str | Path,
    cfg: DistillConfig,
    split: str = "train",
    val_fraction: float = 0.02,
    max_conversations: int | None = None,
    shard_index: int = 0,
    num_shards: int = 1,
    engine: Engine | None = None,
    reference_dir: str | Path | None = None,
) -> dict:
    """Distil `max_conversations` of `source` into `out_dir/shards`, resuming finished batches.

    Sharding (one SLURM array task or rank per shard): batch b belongs to shard b % num_shards.
    Shards split the *same* batches an unsharded run makes, so every batch is generated with the
    same companions, and the merged shards are the unsharded run's, file for file. The engine
    (`cfg.backend`, unless one is passed in) starts only if a batch is left to generate; what it
    is (backend, version, dtype) is recorded in the manifest, and a resume with another is
    refused. Batch files of a committed copy of the same distillation (`reference_dir`,
    `drafters.data.reference`) are restored first, not generated again.
    """
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard index {shard_index} is not in [0, {num_shards})")
    out_dir = Path(out_dir)
    (out_dir / "shards").mkdir(parents=True, exist_ok=True)
    manifest = {
        "target": target.identity.to_dict(),
        "source": source,
        "split": split,
        "val_fraction": val_fraction,
        "config": cfg.settings(),
        "config_fingerprint": cfg.fingerprint(),
    }
    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        old.pop("max_conversations", None)
        old.pop("num_batches", None)
        old_engine = old.pop("engine", None)
        # the target by `TargetIdentity.mismatch` (an identity written by older code is
        # compared on the fields it holds, and kept: it is what the finished batches were
        # checked against); the other settings exactly
        old_target = old.pop("target", None)
        problem = (
            target.identity.mismatch(old_target, f"distillation {out_dir}")
            if TargetIdentity.is_identity(old_target)
            else f"{out_dir}: the manifest's target entry is not a target identity"
        )
        settings = {k: v for k, v in manifest.items() if k != "target"}
        if problem or old != settings:
            diff = sorted(k for k in settings if old.get(k) != settings[k])
            diff = (["target"] if problem else []) + diff
            raise DistillResumeError(
                f"{out_dir} holds a distillation made with other settings ({', '.join(diff)}); "
                "use another output folder (out_dir=...) or delete this one"
                + (f"\n{problem}" if problem else "")
            )
        manifest["target"] = old_target
    else:
        old_engine = None
    manifest["max_conversations"] = max_conversations  # may grow between runs
    if old_engine:
        manifest["engine"] = old_engine
    write_json_atomic(manifest_path, manifest)
    if reference_dir is not None and restore(reference_dir, out_dir, manifest):
        manifest = json.loads(manifest_path.read_text())
        old_engine = manifest.get("engine")

    read_stats = ReadStats()
    conversations = list(
        read_conversations(source, read_stats, split, val_fraction, limit=max_conversations)
    )
    batches = make_batches(conversations, cfg.conversations_per_batch, cfg.pool_batches)
    # A shard is reused only if it holds exactly its batch's conversations (id + content hash):
    # a larger max_conversations re-does only the old partial last batch; a smaller one leaves
    # the extra shards on disk (unused by the merge) for when it grows again.
    mine = [b for b in range(len(batches)) if b % num_shards == shard_index]
    for b in mine:
        path = shard_path(out_dir, b)
        if path.exists() and json.loads(path.read_text())["keys"] != [c.key for c in batches[b]]:
            path.unlink()
    if manifest.get("num_batches") != len(batches):
        manifest["num_batches"] = len(batches)
        write_json_atomic(manifest_path, manifest)
    todo = [b for b in mine if not shard_path(out_dir, b).exists()]
    done_before = len(mine) - len(todo)
    print(f"[distill] conversations: {read_stats.summary()}")
    if done_before:
        print(f"[distill] resuming: {done_before}/{len(batches)} batches already in {out_dir}")

    own_engine = engine is None and bool(todo)
    if own_engine:
        max_len = cfg.max_prompt_tokens + cfg.max_new_tokens
        engine = make_engine(
            cfg.backend, target, cfg.batch_size, max_len, cfg.vllm, log_path=out_dir / "vllm.log"
        )
    if engine is not None and todo:
        if old_engine and old_engine != engine.info:
            if own_engine:
                engine.close()
            raise DistillResumeError(
                f"{out_dir} was distilled with {old_engine}, this run uses {engine.info}; "
                "use another output folder (out_dir=...) or the same engine"
            )
        manifest["engine"] = engine.info
        write_json_atomic(manifest_path, manifest)
        print(f"[distill] engine: {engine.info}")

    t0, new_tokens = time.perf_counter(), 0
    desc = "distill" if num_shards == 1 else f"distill {shard_index}/{num_shards}"
    bar = tqdm(total=sum(len(batches[b]) for b in mine), unit="conv", desc=desc)
    bar.update(sum(len(batches[b]) for b in set(mine) - set(todo)))
    try:
        for b in todo:
            records = generate_turns(
                engine, target.tokenizer, batches[b], cfg, target.eos_token_ids
            )
            keys = [c.key for c in batches[b]]
            made_on = describe()  # fp32 kernels, hence answers, may differ between processors
            write_json_atomic(
                shard_path(out_dir, b), {"keys": keys, "made_on": made_on, "records": records}
            )
            new_tokens += sum(len(ids) for r in records for ids in r["response_ids"])
            bar.update(len(batches[b]))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - t0):.1f}")
    finally:
        bar.close()
        if own_engine:
            engine.close()
    elapsed = time.perf_counter() - t0
    run_stats = {
        "read": read_stats.to_dict(),
        "engine": manifest.get("engine"),
        "batches": len(batches),
        "shard": f"{shard_index}/{num_shards}",
        "batches_of_shard": len(mine),
        "batches_resumed": done_before,
        "generated_tokens_this_run": new_tokens,
        "seconds_this_run": round(elapsed, 2),
        "tokens_per_s_this_run": round(new_tokens / elapsed, 2) if elapsed > 0 else None,
    }
    return run_stats


def distill(cfg) -> dict | None:
    """The `python data/distill.py` job. stage=all: distil and merge; stage=generate: distil
    one shard (shard.index of shard.count; SLURM array tasks set them); stage=merge: merge the
    shards into the dataset (no model needed). Prints and saves the statistics."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    if cfg.stage not in ("all", "generate", "merge", "publish"):
        raise ValueError(f"stage={cfg.stage!r}: use all, generate, merge or publish")
    reference_dir = cfg.get("reference_dir")
    if cfg.stage == "publish":
        return publish(cfg.out_dir, reference_dir)
    run_stats = None
    if cfg.stage in ("all", "generate"):
        gen = DistillConfig(**OmegaConf.to_container(cfg.generation, resolve=True))
        # vLLM loads the weights itself: this process needs the tokenizer and identity only
        target = instantiate(cfg.target, **({"device": "meta"} if gen.backend == "vllm" else {}))
        run_stats = run_distillation(
            target,
            cfg.source,
            cfg.out_dir,
            gen,
            split=cfg.split,
            val_fraction=cfg.val_fraction,
            max_conversations=cfg.max_conversations,
            shard_index=int(cfg.shard.index),
            num_shards=int(cfg.shard.count),
            reference_dir=reference_dir,
        )
        print(f"[distill] {json.dumps(run_stats)}")
    if cfg.stage == "generate":
        return None
    if cfg.stage == "merge" and reference_dir is not None:
        restore(reference_dir, cfg.out_dir)
    manifest = json.loads((Path(cfg.out_dir) / "manifest.json").read_text())
    partial = bool(cfg.get("merge_partial", False))
    if partial and cfg.stage != "merge":
        raise ValueError("merge_partial=true goes with stage=merge (a snapshot of the shards)")
    _, stats = finalize(
        cfg.out_dir, manifest["target"], run_stats, cfg.drop_length_cut, partial=partial
    )
    print(json.dumps(stats, indent=1))
    print(f"[distill] dataset: {Path(cfg.out_dir) / 'dataset'}; stats: {cfg.out_dir}/stats.json")
    return stats
