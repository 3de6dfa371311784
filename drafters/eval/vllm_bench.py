"""The benchmark inside the engine users deploy: the same prompts through vLLM offline, batch 1.

    drafters-bench-vllm --bench mt_bench --per-category 2 --dtype bfloat16 \\
        --drafter outputs/medusa_smollm2-vllm --drafter outputs/falcon_k1_smollm2-vllm:4 \\
        --out outputs/vllm_bench

Methods: `plain` (vLLM greedy, the baseline of speedup and agreement), `ngram` (vLLM's own n-gram
speculation, `--ngram N` tokens, lookup of 2..4-grams; `--ngram 0` skips it) and, per `--drafter
FOLDER[:N]`, a folder written by `drafters-export --format vllm` (N speculative tokens; default:
the Medusa drafter's number of heads, 3 for EAGLE). Every method gets its own engine in its own
process (`drafters/eval/vllm_spec_worker.py` under `.venv-vllm`), the same prompts (first turns,
rendered with the target's chat template), greedy, `--warmup` prompts untimed first.

Reported per method: tokens/s (generated tokens / seconds of `generate`, summed over prompts),
speedup over plain, tau from vLLM's own spec-decode counters (1 + accepted / drafts: tokens per
target forward, bonus included; 1 for plain), the acceptance rate at each draft position, and
agreement with plain greedy in the same dtype: prompts whose output equals plain's token for
token, and where the others first differ. Agreement is measured, never assumed.

`--iomp` preloads Intel OpenMP (libiomp5 from the vLLM environment), which vLLM's CPU backend
asks for when speculating; run with and without to see what it is worth here.

Written to --out: one result file per method (a killed run resumes at the next method; a method
is rerun when its settings changed), results.json (settings, per-method summary, per-prompt
records) and results.md (the table, also printed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from drafters.eval.questions import EVAL_DIR, load_questions
from drafters.eval.records import first_divergence
from drafters.machine import describe

WORKER = Path(__file__).with_name("vllm_spec_worker.py")
PLAIN = "plain"


def parse_drafter(spec: str) -> tuple[Path, int | None]:
    folder, _, n = spec.partition(":")
    if n and not n.isdigit():
        raise ValueError(f"--drafter {spec!r}: expected FOLDER or FOLDER:N (N speculative tokens)")
    return Path(folder), int(n) if n else None


def drafter_method(spec: str) -> dict:
    """A `--drafter FOLDER[:N]` as a method: its name and vLLM speculative_config."""
    folder, n = parse_drafter(spec)
    source = folder / "drafters_source.json"
    if not source.is_file():
        raise ValueError(
            f"{folder}: not a vLLM export (no {source.name}); make one with "
            f"`drafters-export DRAFTER {folder} --format vllm`"
        )
    info = json.loads(source.read_text())
    n = n or info.get("num_speculative_tokens") or 3
    config = {"method": info["vllm_method"], "model": str(folder.resolve()),
              "num_speculative_tokens": int(n)}  # fmt: skip
    return {"name": f"{folder.name}:{n}", "speculative_config": config, "target": info["target"]}


def engine_kwargs(
    target_path: str, dtype: str, max_model_len: int, kv_cache_gib: float, eager: bool = False
) -> dict:
    return {
        "enforce_eager": eager,
        "model": target_path,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": 1,
        "seed": 0,
        "generation_config": "vllm",  # the model folder's sampling defaults never apply
        "kv_cache_memory_bytes": int(kv_cache_gib * 2**30),
    }


def worker_env(iomp: bool, python: str) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    if iomp:
        lib = Path(python).absolute().parents[1] / "lib" / "libiomp5.so"  # venv's lib/
        if not lib.is_file():
            raise ValueError(f"--iomp: no {lib} (pip install intel-openmp into that environment)")
        env["LD_PRELOAD"] = ":".join(filter(None, [str(lib), env.get("LD_PRELOAD")]))
    return env


def run_method(python: str, job: dict, out_dir: Path, env: dict) -> dict:
    """One method in its own worker process; cached in out_dir by the job's hash."""
    name = job["methods"][0]["name"]
    key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = out_dir / "methods" / f"{safe}-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())["methods"][name]
    path.parent.mkdir(parents=True, exist_ok=True)
    job_path = path.with_suffix(".job.json")
    job_path.write_text(json.dumps(job))
    log = path.with_suffix(".log")
    with open(log, "w") as fh:
        res = subprocess.run([python, str(WORKER), str(job_path), str(path) + ".tmp"],
                             stdout=fh, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    if res.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(
            f"vLLM worker for {name!r} failed (exit {res.returncode}); {log}:\n{tail}"
        )
    os.replace(str(path) + ".tmp", path)
    job_path.unlink()
    return json.loads(path.read_text())["methods"][name]


def summarize(name: str, runs: list[dict], plain: list[dict] | None) -> dict:
    tokens = sum(len(r["ids"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    drafts = sum(r["drafts"] for r in runs)
    accepted = sum(r["accepted"] for r in runs)
    width = max((len(r["accepted_per_pos"]) for r in runs), default=0)
    per_pos = [sum(r["accepted_per_pos"][i] for r in runs if i < len(r["accepted_per_pos"]))
               for i in range(width)]  # fmt: skip
    s = {
        "method": name,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "tau": 1 + accepted / drafts if drafts else 1.0,
        "drafts": drafts,
        "accept_rate_by_pos": [a / drafts for a in per_pos] if drafts else [],
    }
    if plain is not None:
        div = [first_divergence(r["ids"], p["ids"]) for r, p in zip(runs, plain, strict=True)]
        s["same_as_plain"] = sum(d is None for d in div)
        s["first_divergence"] = [d for d in div if d is not None]
    return s


def table(summaries: list[dict], dtype: str, n_prompts: int) -> str:
    base = next((s for s in summaries if s["method"] == PLAIN), None)
    lines = [
        "| method | tokens/s | speedup | tau (vLLM) | acceptance by position "
        f"| same as plain ({dtype}) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for s in summaries:
        speed = f"{s['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        rates = " / ".join(f"{r:.2f}" for r in s["accept_rate_by_pos"]) or "-"
        same = f"{s.get('same_as_plain', '-')}/{n_prompts}"
        if s.get("first_divergence"):
            same += f" (first differ at {', '.join(map(str, s['first_divergence']))})"
        lines.append(f"| {s['method']} | {s['tokens_per_s']:.1f} | {speed} | {s['tau']:.2f} | "
                     f"{rates} | {same} |")  # fmt: skip
    return "\n".join(lines)


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="drafters-bench-vllm", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--bench", choices=["mt_bench", "spec_bench"], default="mt_bench")
    p.add_argument("--eval-dir", default=str(EVAL_DIR))
    p.add_argument("--questions", default=None, metavar="FILE", help="this prompt file instead")
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--target", default=None, help="default: the drafters' target (or smollm2_135m)")
    p.add_argument("--ngram", type=int, default=3, help="vLLM n-gram speculative tokens (0: skip)")
    p.add_argument("--drafter", action="append", default=[], help="vLLM export FOLDER[:N]")
    p.add_argument("--iomp", action="store_true", help="preload Intel OpenMP (libiomp5)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument(
        "--enforce-eager", action="store_true", help="no compiled graphs (starts much sooner)"
    )
    p.add_argument("--python", default=None, help="the Python with vLLM (default: .venv-vllm)")
    p.add_argument("--out", default="outputs/vllm_bench")
    return p


def main(argv: list[str] | None = None) -> int:
    from drafters.data.chat import render_prompt
    from drafters.data.engines.vllm_client import vllm_python
    from drafters.target import load_target

    args = args_parser().parse_args(argv)
    drafters = [drafter_method(s) for s in args.drafter]
    identity = drafters[0]["target"] if drafters and args.target is None else None
    target = load_target(args.target or (None if identity else "smollm2_135m"), identity)
    if not target.path:
        raise ValueError(f"target {target.name}: no folder or hub id for vLLM to load")
    path = Path(args.questions or Path(args.eval_dir) / f"{args.bench}_question.jsonl")
    questions = load_questions(path, args.bench, args.per_category, args.seed)
    prompts = [render_prompt(target.tokenizer, [{"role": "user", "content": q["turns"][0]}])
               for q in questions]  # fmt: skip
    python = vllm_python(args.python)
    methods = [{"name": PLAIN, "speculative_config": None}]
    if args.ngram:
        methods.append({"name": f"ngram:{args.ngram}", "speculative_config": {
            "method": "ngram", "num_speculative_tokens": args.ngram,
            "prompt_lookup_min": 2, "prompt_lookup_max": 4}})  # fmt: skip
    methods += [{k: d[k] for k in ("name", "speculative_config")} for d in drafters]
    job = {
        "engine": engine_kwargs(
            target.path, args.dtype, args.max_model_len, args.kv_cache_gib, args.enforce_eager
        ),
        "prompts": prompts,
        "sampling": {"max_tokens": args.max_new_tokens, "temperature": 0.0},
        "warmup": args.warmup,
        "iomp": args.iomp,
    }
    out = Path(args.out)
    env = worker_env(args.iomp, python)
    results = {}
    for m in methods:
        print(f"[vllm-bench] {m['name']} ...", file=sys.stderr, flush=True)
        results[m["name"]] = run_method(python, {**job, "methods": [m]}, out, env)
    plain = results[PLAIN]["runs"]
    summaries = [summarize(n, r["runs"], plain) for n, r in results.items()]
    md = table(summaries, args.dtype, len(prompts))
    settings = {k: v for k, v in vars(args).items() if k != "python"}
    settings.update(machine=describe(), target=target.name, prompts=len(prompts))
    records = [
        {"method": n, "question_id": q["question_id"], "category": q["category"], **run}
        for n, r in results.items()
        for q, run in zip(questions, r["runs"], strict=True)
    ]
    (out / "results.json").write_text(json.dumps(
        {"settings": settings, "summary": summaries, "records": records}, indent=1))  # fmt: skip
    header = (f"vLLM {args.dtype}, batch 1, {len(prompts)} {args.bench} prompts (first turns), "
              f"{args.max_new_tokens} new tokens max, {describe()}"
              f"{', Intel OpenMP preloaded' if args.iomp else ''}")  # fmt: skip
    (out / "results.md").write_text(header + "\n\n" + md + "\n")
    print(header + "\n\n" + md)
    return 0
