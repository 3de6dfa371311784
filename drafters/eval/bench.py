"""Spec-Bench style benchmark (docs/design.md section 6): every method on the same prompts, one run.

    drafters-bench --bench mt_bench --per-category 2 --drafter outputs/cerberus_smollm2
    drafters-bench --bench spec_bench --per-category 10 --turns 2 --threads 2 \\
        --methods hf_greedy ar hf_prompt_lookup hf_early_exit --drafter A --drafter B --out bench/x
    drafters-bench --questions my_heldout.jsonl --drafter A     # any file in the same format

Protocol: batch 1, greedy, one target (same dtype, same machine, same run); warm-up generations
first; questions run one after another with every method in turn (so load drift on a shared
machine hits all methods alike); only generation is timed (prefill + decoding, device
synchronised; tokenization and the gate's cost measurement are not). A question's turns run in
order, the second turn's prompt holding the method's own first answer (Spec-Bench).

Methods (each optional): hf_greedy (the baseline: HF `generate(do_sample=False)` with its KV
cache), ar (the in-house AR loop), hf_prompt_lookup (`prompt_lookup_num_tokens`), hf_early_exit
(`assistant_early_exit`), ngram (n-gram candidates through the in-house verifier, sized per step
by cost), and per `--drafter FOLDER` the method `<folder>` (no gate) and `<folder>+<gate>` for
each gate asked for with `--gates` (entropy, learned: head drafters; budget, hybrid: a dynamic
tree sized per step, with n-gram candidates for hybrid, every drafter; dynamic<n>, hybrid<n>:
the same trees at n nodes every step), or with `--drafter FOLDER@none,entropy` for that drafter
alone. Every turn records how many draft nodes each step verified (`nodes_hist`).

Reported per method and category (and "all"): tau (new tokens per target verification forward,
bonus included, pooled over all turns; "-" for HF methods, whose forwards are not counted),
alpha (accepted draft tokens / new tokens), tokens/s (mean over questions of new tokens /
seconds, turns pooled within a question), speedup (that mean / hf_greedy's on the same
questions), lossless (questions whose every turn equals hf_greedy's output token for token), and
for Falcon drafters tau by N mod k (`tau_by_phase`: tau over the verification forwards whose
root t_N has N mod k == r, r = 0 .. k-1, k the drafter's block size; see methods.py's
`_decode_stats`).
Written to --out: results.json (settings, summary, per-question records), results.md (the table,
also printed), speedup_by_category.png, accept_lengths.png.

Long runs: every finished question is appended to --out/records/ at once, so a killed run resumes
where it stopped (same command; other settings are refused). `--shard I/N` runs every N-th
question from the I-th, so N processes (e.g. one thread each) share the work; each question still
runs all methods back to back, so its speedups compare like with like. The process that records
the last question writes the reports; `--merge --out DIR` writes them again from the records.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from drafters.eval.methods import Method, build_methods, split_drafter_spec
from drafters.eval.questions import load_questions
from drafters.eval.records import RecordStore, mark_lossless, merge
from drafters.machine import describe


def run_question(target, method: Method, question: dict, turns: int, max_new_tokens: int) -> dict:
    from drafters.data.chat import render_prompt
    from drafters.decoding.result import sync_clock

    tok = target.tokenizer
    messages: list[dict] = []
    records = []
    for text in question["turns"][:turns]:
        messages.append({"role": "user", "content": text})
        ids = torch.tensor([render_prompt(tok, messages)], device=target.device)
        extra = method.before(ids) if method.before else {}
        t0 = sync_clock(target.device)
        out, stats = method.generate(ids, max_new_tokens)
        seconds = sync_clock(target.device) - t0
        answer = tok.decode(out, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        records.append(
            {"prompt_tokens": ids.shape[1], "new_tokens": len(out), "seconds": seconds,
             **stats, **extra, "answer": answer, "_ids": out}
        )  # fmt: skip
    new = sum(r["new_tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    return {
        "question_id": question["question_id"],
        "category": question["category"],
        "method": method.name,
        "new_tokens": new,
        "seconds": seconds,
        "tokens_per_s": new / seconds if seconds > 0 else float("nan"),
        "turns": records,
    }


def run(args) -> dict:
    """Run this shard's questions not yet recorded under --out, then write the reports once every
    question of the run has its record (the last shard to finish writes them)."""
    from drafters.export import read_config
    from drafters.target import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    index, count = args.shard
    eval_file = Path(args.questions or Path(args.eval_dir) / f"{args.bench}_question.jsonl")
    questions = load_questions(eval_file, args.bench, args.per_category, args.seed)
    identity = (
        read_config(split_drafter_spec(args.drafter[0])[0])["target"] if args.drafter else None
    )
    target = load_target(args.target, identity, args.dtype, args.device)
    methods = build_methods(args, target)

    settings = {
        "bench": args.bench,
        "eval_file": str(eval_file),
        "eval_sha256": hashlib.sha256(eval_file.read_bytes()).hexdigest(),
        "questions": len(questions),
        "question_ids": [q["question_id"] for q in questions],
        "per_category": args.per_category,
        "seed": args.seed,
        "turns": args.turns,
        "max_new_tokens": args.max_new_tokens,
        "warmup_questions": min(args.warmup, len(questions)),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        # processes sharing the machine, one shard each (--shard I/N): requests in flight at once
        # (each record keeps its own; the report names every count the records hold)
        "lanes": count,
        "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "target": target.identity.to_dict(),
        "machine": describe(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "timing": "generation only (prefill + decoding); gate cost ratio measured untimed",
        "tau": "new tokens per target verification forward, bonus token included",
    }
    info = {m.name: {"kind": m.kind, **m.info} for m in methods}
    store = RecordStore(Path(args.out), settings, info)
    done = store.done()
    todo = [q for i, q in enumerate(questions) if i % count == index]
    todo = [q for q in todo if q["question_id"] not in done]
    print(
        f"[bench] shard {index}/{count}: {len(todo)} questions to run, "
        f"{len(done)} of {len(questions)} already recorded in {store.folder}",
        file=sys.stderr,
    )

    for q in todo[: args.warmup]:  # warm-up: allocators, kernels, caches; not recorded
        for m in methods:
            run_question(target, m, q, 1, min(args.max_new_tokens, 32))

    bar = tqdm(todo, desc=f"bench {index}/{count}", unit="prompt", dynamic_ncols=True,
               file=sys.stderr)  # fmt: skip
    for q in bar:
        batch = [run_question(target, m, q, args.turns, args.max_new_tokens) for m in methods]
        for r in batch:
            r["lanes"] = count  # a resumed run may use another --shard count: kept per question
        mark_lossless(batch)
        store.append(q["question_id"], batch)
        bar.set_postfix({r["method"][:12]: f"{r['tokens_per_s']:.0f}" for r in batch[:4]})
    bar.close()
    return merge(Path(args.out))
