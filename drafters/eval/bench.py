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
root t_N has N mod k == r, r = 0 .. k-1, k the drafter's block size; see `_decode_stats`).
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
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from drafters.eval.records import BASELINE, RecordStore, merge
from drafters.machine import describe

MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)  # fmt: skip
BUILTIN_METHODS = ("hf_greedy", "ar", "hf_prompt_lookup", "hf_early_exit", "ngram")
GATE_CHOICES = ("none", "default", "entropy", "learned", "budget", "hybrid", "budget+entropy",
                "budget+learned", "hybrid+entropy", "hybrid+learned")  # fmt: skip
FIXED_SIZE = re.compile(r"(dynamic|hybrid)(\d+)")  # a dynamic tree of n nodes a step
# MT-Bench and Spec-Bench, shipped inside the package (prompts/README.md: sources, licences)
EVAL_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass
class Method:
    name: str
    kind: str  # "hf" | "ar" | a drafter kind
    generate: Callable[[torch.Tensor, int], tuple[list[int], dict]]  # ids (1, T), n -> out
    info: dict = field(default_factory=dict)
    before: Callable[[torch.Tensor], dict] | None = None  # untimed per-turn set-up


# ---- prompts ------------------------------------------------------------------------------


def read_questions(path: Path) -> list[dict]:
    """A prompt file in the Spec-Bench format: one JSON object a line with `question_id`,
    `category` and `turns` (a list of user messages). Any problem names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    rows, ids = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f'{path}:{n}: needs "turns": a non-empty list of strings')
        if "question_id" not in row or not isinstance(row.get("category"), str):
            raise ValueError(f'{path}:{n}: needs "question_id" and a "category" string')
        if row["question_id"] in ids:
            raise ValueError(f"{path}:{n}: question_id {row['question_id']!r} appears twice")
        ids.add(row["question_id"])
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no questions")
    return rows


def load_questions(path: Path, bench: str, per_category: int | None, seed: int) -> list[dict]:
    """Rows of a Spec-Bench style jsonl; in spec_bench the MT-Bench categories are pooled into
    one category "mt_bench" (Spec-Bench's multi-turn conversation). per_category: a seeded
    sample of that many questions per category, kept in file order."""
    rows = read_questions(path)
    for r in rows:
        if bench == "spec_bench" and r["category"] in MT_BENCH_CATEGORIES:
            r["category"] = "mt_bench"
    if per_category is not None:
        rng = random.Random(seed)
        by_cat: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_cat.setdefault(r["category"], []).append(i)
        keep = {i for idx in by_cat.values() for i in rng.sample(idx, min(per_category, len(idx)))}
        rows = [r for i, r in enumerate(rows) if i in keep]
    return rows


# ---- methods ------------------------------------------------------------------------------


# The assistant's own settings. With `assistant_early_exit` the assistant is the target itself and
# HF reads these from `model.generation_config`, not from generate()'s keyword arguments (checked
# on transformers 5.24: passed to generate(), the early-exit drafter still drafts 20 tokens with
# threshold 0.4), so hf_method sets them on the model's config for the call.
ASSISTANT_KEYS = ("num_assistant_tokens", "assistant_confidence_threshold",
                  "num_assistant_tokens_schedule")  # fmt: skip


def hf_method(target, name: str, **generate_kwargs) -> Method:
    """HF `generate(do_sample=False)` with `generate_kwargs` (prompt lookup, early exit, ...)."""
    kwargs = dict(generate_kwargs)
    assistant = {}
    if kwargs.get("assistant_early_exit") is not None:
        assistant = {k: kwargs.pop(k) for k in ASSISTANT_KEYS if k in kwargs}

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        config = target.model.generation_config
        saved = {k: getattr(config, k, None) for k in assistant}
        for k, v in assistant.items():
            setattr(config, k, v)
        try:
            out = target.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                pad_token_id=target.tokenizer.pad_token_id,
                **kwargs,
            )
        finally:
            for k, v in saved.items():
                setattr(config, k, v)
        return out[0, ids.shape[1] :].tolist(), {}

    return Method(name, "hf", generate, dict(generate_kwargs))


def ngram_method(target) -> Method:
    """n-gram candidates only (prompt lookup) through the in-house verifier, sized per step by
    cost like the budget gate (`drafters.decoding.dynamic`)."""
    from drafters.decoding.cost import cost_profile
    from drafters.decoding.dynamic import DynamicConfig, decode_dynamic

    cfg = DynamicConfig()

    def before(ids: torch.Tensor) -> dict:
        cost_profile(target, cfg.max_nodes + 1)  # measured once, untimed
        return {}

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        res = decode_dynamic(target, None, ids, n, cfg)
        return res.output_ids.tolist(), _decode_stats(res)

    return Method("ngram", "ngram", generate, {"max_nodes": cfg.max_nodes}, before)


def ar_method(target) -> Method:
    from drafters.decoding import decode_ar

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        res = decode_ar(target, ids, n)
        return res.output_ids.tolist(), _decode_stats(res)

    return Method("ar", "ar", generate)


def drafter_method(target, drafter, gate: str | None, name: str, tree=None, dynamic=None) -> Method:
    """tree: None (the exported one) or a list of paths overriding it (e.g. tuning sweeps);
    dynamic: the `DynamicConfig` of a budget or hybrid gate (None: its defaults)."""
    from drafters.speculate import BUDGET_GATES, cost_ratio, dynamic_config, speculative_decode

    state: dict = {}
    phase_k = drafter.model.cfg.k if drafter.kind == "falcon" else None  # tau by N mod k

    def before(ids: torch.Tensor) -> dict:
        if gate is None:
            return {}
        if gate in BUDGET_GATES:  # the step cost profile, measured once per run, untimed
            from drafters.decoding.cost import cost_profile

            cfg = dynamic_config(gate, dynamic)
            if cfg.budget is None:  # a fixed budget reads no cost
                cost_profile(target, cfg.max_nodes + 1)
            return {}
        state["cost_ratio"] = cost_ratio(target, drafter, ids.shape[1])
        return {"cost_ratio": state["cost_ratio"]}

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        res = speculative_decode(
            target, drafter, ids, n, gate=gate or "none", tree=tree,
            cost_ratio=state.get("cost_ratio"), dynamic=dynamic,
        )  # fmt: skip
        return res.output_ids.tolist(), _decode_stats(res, phase_k)

    used = drafter.tree if tree is None else tree
    named = tree if isinstance(tree, str) else "given"  # a preset / chain<K>, or paths
    info = {
        "drafter": str(drafter.folder),
        "gate": gate,
        "tree": drafter.config["tree"]["name"] if tree is None else named,
        "tree_nodes": None if isinstance(used, str) or not hasattr(used, "__len__") else len(used),
        "num_params": drafter.config["weights"]["num_params"],
    }
    if dynamic is not None:  # as decoded (dynamic<n>: no n-gram candidates)
        info["dynamic"] = asdict(dynamic_config(gate, dynamic))
    return Method(name, drafter.kind, generate, info, before)


def _decode_stats(res, phase_k: int | None = None) -> dict:
    """A turn's record of a decode: `res.stats()` less the wall time, `accept_hist` (verification
    forwards per accepted length 0, 1, ...) and, with phase_k (Falcon's k; None for head
    drafters and AR, whose drafting does not depend on N mod k), `tau_by_phase`: the raw counts
    of `DecodeResult.tau_by_phase`, {"r": {"steps": .., "tokens": ..}} for r = 0 .. k-1, which
    the report pools into tau per phase."""
    s = res.stats()
    hist = Counter(res.accept_lens)
    s["accept_hist"] = [hist.get(a, 0) for a in range(max(hist, default=-1) + 1)]
    nodes = Counter(res.step_nodes)  # draft nodes verified per step (0: an AR step)
    s["nodes_hist"] = [nodes.get(n, 0) for n in range(max(nodes, default=-1) + 1)]
    s.pop("wall_time_s")
    if phase_k is not None:
        phases = res.tau_by_phase(phase_k)
        s["tau_by_phase"] = {
            str(r): {"steps": p["steps"], "tokens": p["tokens"]} for r, p in phases.items()
        }
    return s


def fixed_size_gate(name: str):
    """ "dynamic<n>" / "hybrid<n>": the dynamic tree (without / with n-gram candidates) verifying
    its n best candidates every step, as (gate, DynamicConfig); None for any other name."""
    m = FIXED_SIZE.fullmatch(name)
    if m is None:
        return None
    from drafters.decoding.dynamic import DynamicConfig

    return ("budget" if m[1] == "dynamic" else "hybrid"), DynamicConfig.fixed(int(m[2]))


def split_drafter_spec(spec: str) -> tuple[str, list[str] | None]:
    """ "FOLDER" or "FOLDER@GATE[,GATE..]" (that drafter's own --gates list; besides
    GATE_CHOICES, dynamic<n> and hybrid<n> for a dynamic tree of n nodes a step)."""
    folder, sep, gates = spec.rpartition("@")
    if not sep:
        return spec, None
    names = gates.split(",")
    bad = [g for g in names if g not in GATE_CHOICES and not FIXED_SIZE.fullmatch(g)]
    if bad:
        raise ValueError(f"--drafter {spec!r}: unknown gate {bad[0]!r}; use one of "
                         f"{GATE_CHOICES}, dynamic<n> or hybrid<n> (n nodes a step)")  # fmt: skip
    return folder, names


def build_methods(args, target) -> list[Method]:
    from drafters.export import load_drafter
    from drafters.speculate import BUDGET_GATES

    methods: list[Method] = []
    for name in args.methods:
        if name == "hf_greedy":
            methods.append(hf_method(target, name))
        elif name == "ar":
            methods.append(ar_method(target))
        elif name == "ngram":
            methods.append(ngram_method(target))
        elif name == "hf_prompt_lookup":
            methods.append(hf_method(target, name, prompt_lookup_num_tokens=args.prompt_lookup))
        elif name == "hf_early_exit":
            layer = args.early_exit_layer or max(1, target.config.num_hidden_layers // 5)
            extra = {"num_assistant_tokens": args.early_exit_tokens,
                     "assistant_confidence_threshold": args.early_exit_threshold}  # fmt: skip
            extra = {k: v for k, v in extra.items() if v is not None}
            methods.append(hf_method(target, name, assistant_early_exit=layer, **extra))
    taken = {m.name for m in methods}
    for spec in args.drafter:
        folder, own_gates = split_drafter_spec(spec)
        drafter = load_drafter(folder, target)  # refuses a drafter of another target
        base = drafter.name
        i = 2
        while base in taken:
            base, i = f"{drafter.name}_{i}", i + 1
        gates: list[str | None] = []
        for g in own_gates or args.gates:
            g = (drafter.config["gate"]["default"] if g == "default" else g) or "none"
            # dynamic trees, any kind
            budget = g in ("budget", "hybrid") or FIXED_SIZE.fullmatch(g) is not None
            own = g.partition("+")[2] if "+" in g else g  # the drafter's gate it needs, if any
            if (
                g != "none"
                and not budget
                and (drafter.kind == "falcon" or own not in drafter.gates)
            ):
                continue  # no such gate on this drafter
            gates.append(None if g == "none" else g)
        for g in dict.fromkeys(gates):
            name = base if g is None else f"{base}+{g}"
            taken.add(name)
            gate, dynamic = fixed_size_gate(g or "") or (g, None)
            tree = None if gate in BUDGET_GATES else args.tree  # --tree (None: exported)
            methods.append(drafter_method(target, drafter, gate, name, tree, dynamic))
    if not methods:
        raise ValueError("no method to run: give --methods and/or --drafter")
    return methods


# ---- running ------------------------------------------------------------------------------


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


def first_divergence(ids: list[int], ref: list[int]) -> int | None:
    """The index of the first token where `ids` leaves `ref` (a shorter or longer output leaves
    it where it ends); None if equal."""
    if ids == ref:
        return None
    return next((i for i, (a, b) in enumerate(zip(ids, ref, strict=False)) if a != b),
                min(len(ids), len(ref)))  # fmt: skip


def mark_lossless(records: list[dict]) -> None:
    """Per turn and per question: equal to hf_greedy's output token for token (None without
    the baseline), and per turn where it first differs (`first_divergence`). Drops the token
    ids afterwards (the JSON keeps the decoded answers)."""
    ref = next((r for r in records if r["method"] == BASELINE), None)
    for r in records:
        for i, t in enumerate(r["turns"]):
            base = None if ref is None else ref["turns"][i]["_ids"]
            t["lossless"] = None if base is None else t["_ids"] == base
            t["first_divergence"] = None if base is None else first_divergence(t["_ids"], base)
        r["lossless"] = None if ref is None else all(t["lossless"] for t in r["turns"])
    for r in records:
        for t in r["turns"]:
            t.pop("_ids")


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
