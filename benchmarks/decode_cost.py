"""What a decoding step costs, in plain greedy steps: the break-even τ of every drafter and tree.

    python benchmarks/decode_cost.py                       # SmolLM2, fp32, 1 thread, 3 prompts
    python benchmarks/decode_cost.py --threads 2 --max-new-tokens 96 --dtype bfloat16
    python benchmarks/decode_cost.py --before ea76757 --rounds 2   # before/after, interleaved

A drafter pays only when its τ (new tokens per verification forward) exceeds the time of one of
its steps in HF greedy steps: that ratio is its break-even τ. Drafters here have random weights
(cost does not depend on what they learnt; they accept almost nothing, so every step is a full
tree step): Medusa (K = 4) and Cerberus (K = 4) over static trees, Falcon (k = 2) over its trees,
each at the default draft vocabulary (8,192). Step time = (time to n new tokens - time to 1 new
token) / verification forwards, per prompt, pooled over prompts (first user turns of MT-Bench
questions, one per category); HF greedy's step = the same difference / (n - 1), measured right
before each decoder's, so that both see the same machine load. Every output is checked against
the in-house AR loop's (lossless), else the script stops.

--before REF measures the code of commit REF (checked out with `git archive` into a temporary
folder and imported from there) against this working tree's, in one run: `--rounds` rounds,
each running one process per arm, the arms' order alternating between rounds, so drift in the
machine's load (the other core's job, thermal state) falls on both arms alike. Each cell is the
median over rounds of the break-even τ, with the rounds' spread. The code at REF must offer what
this script imports (drafters.decoding.decode_heads, drafters.models.vocab.top_ids, ...: true
from ea76757, the commit before the decoder-cost changes, on).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]

HEAD_TREES = {
    "3 (2)": [[0], [1], [0, 0]],
    "8 (4)": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]],
    "16 (3)": "mc_sim_7b_63_first16",
}
FALCON_TREES = {  # nodes (depth); k = 2, so passes = ceil(depth / 2)
    "3 (3), 2 passes": "chain3",
    "8 (4), 2 passes": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]],
    "32 (8), 4 passes": "falcon_k2_32",
}


def prompts(target, n: int) -> list[torch.Tensor]:
    from drafters.data.chat import render_prompt
    from drafters.eval.questions import load_questions

    path = ROOT / "drafters/eval/prompts/mt_bench_question.jsonl"
    qs = load_questions(path, "mt_bench", 1, 0)[:n]
    msgs = [[{"role": "user", "content": q["turns"][0]}] for q in qs]
    return [torch.tensor([render_prompt(target.tokenizer, m)]) for m in msgs]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def step_cost(decode, ids_list, n: int, refs) -> tuple[float, int]:
    """(seconds per verification forward, forwards) pooled over prompts; outputs checked. A
    first untimed call pays what a decoder does once per process (its linears' kernel plan is
    measured on first use, `drafters.decoding.linears`)."""
    decode(ids_list[0], 2)
    seconds, forwards = 0.0, 0
    for ids, ref in zip(ids_list, refs, strict=True):
        t1, _ = timed(lambda ids=ids: decode(ids, 1))
        tn, res = timed(lambda ids=ids: decode(ids, n))
        if not torch.equal(res.sequences, ref):
            raise AssertionError("output differs from the AR loop's: a decoder bug")
        seconds += tn - t1
        forwards += res.verify_forwards
    return seconds / max(forwards, 1), forwards


def cases(target, draft_vocab: int):
    """(decoder, tree label, decode(ids, n)) for the AR loop and every drafter and tree."""
    from drafters.decoding import decode_ar, decode_heads
    from drafters.decoding.falcon import decode_falcon
    from drafters.models import build_drafter
    from drafters.models.vocab import top_ids
    from drafters.training.run import drafter_config

    yield "AR loop", "-", lambda ids, m: decode_ar(target, ids, m)
    counts = torch.zeros(target.vocab_size)
    counts[:draft_vocab] = 1  # which ids does not matter for cost
    for kind in ("medusa", "cerberus", "falcon"):
        torch.manual_seed(0)
        cfg = drafter_config(kind, {"draft_vocab_size": draft_vocab}, target)
        model = build_drafter(kind, cfg).eval().to(target.dtype)
        if model.vocab is not None:
            model.vocab.set_ids(top_ids(counts, model.vocab.size))
        trees = FALCON_TREES if kind == "falcon" else HEAD_TREES
        for label, tree in trees.items():
            if kind == "falcon":

                def decode(ids, m, tree=tree, model=model):
                    return decode_falcon(target, model, ids, m, tree=tree)
            else:

                def decode(ids, m, tree=tree, model=model):
                    return decode_heads(target, model, tree, ids, m)

            yield kind, label, decode


def measure(args) -> dict:
    """Every case of this process's `drafters`: {"hf_ms", "rows": [{decoder, tree, ms, ratio}]}."""
    from drafters import load_target
    from drafters.decoding import decode_ar

    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype)
    ids_list = prompts(target, args.prompts)
    n = args.max_new_tokens
    refs = [decode_ar(target, ids, n).sequences for ids in ids_list]

    def hf(ids, m):
        mask = torch.ones_like(ids)
        out = target.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=m)
        return SimpleNamespace(sequences=out, verify_forwards=out.shape[1] - ids.shape[1] - 1)

    rows, hf_steps = [], []
    for decoder, label, decode in cases(target, args.draft_vocab):
        hf_step, _ = step_cost(hf, ids_list, n, refs)
        step, _ = step_cost(decode, ids_list, n, refs)
        hf_steps.append(hf_step)
        rows.append({"decoder": decoder, "tree": label, "ms": step * 1e3, "ratio": step / hf_step})
        print(f"[cost] {decoder} {label}: {step * 1e3:.1f} ms a step, HF greedy "
              f"{hf_step * 1e3:.1f}", file=sys.stderr)  # fmt: skip
    return {"hf_ms": 1e3 * sorted(hf_steps)[len(hf_steps) // 2], "rows": rows,
            "dtype": str(target.dtype), "drafters": str(Path(drafters_file()).parent)}  # fmt: skip


def drafters_file() -> str:
    import drafters

    return drafters.__file__


def header(args) -> str:
    from drafters.machine import processor_name

    return (f"{args.target}, {args.dtype or 'float32'}, {args.threads} thread(s), "
            f"{processor_name()}; {args.prompts} MT-Bench first turns, {args.max_new_tokens} new "
            f"tokens; random drafters, V_d {args.draft_vocab}")  # fmt: skip


def worker_argv(args, out: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", str(out),
            "--target", args.target, "--threads", str(args.threads), "--prompts",
            str(args.prompts), "--max-new-tokens", str(args.max_new_tokens), "--draft-vocab",
            str(args.draft_vocab)] + (["--dtype", args.dtype] if args.dtype else [])  # fmt: skip


def before_after(args) -> None:
    """Both arms, `args.rounds` rounds, one process per arm and round, order alternating."""
    import json
    import os
    import statistics
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "drafters"],
                                 check=True, capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        arms = {"before": str(old), "after": str(ROOT)}
        results: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for arm in order:
                out = Path(tmp) / f"{arm}_{r}.json"
                env = {**os.environ, "PYTHONPATH": arms[arm]}
                print(f"[cost] round {r + 1}/{args.rounds}: {arm}", file=sys.stderr)
                subprocess.run(worker_argv(args, out), env=env, check=True)
                res = json.loads(out.read_text())
                if Path(res["drafters"]).resolve() != (Path(arms[arm]) / "drafters").resolve():
                    raise RuntimeError(f"{arm}: imported drafters from {res['drafters']}")
                results[arm].append(res)

    def cell(arm: str, i: int) -> tuple[float, float, float, float]:
        ratios = [res["rows"][i]["ratio"] for res in results[arm]]
        ms = statistics.median(res["rows"][i]["ms"] for res in results[arm])
        return ms, statistics.median(ratios), min(ratios), max(ratios)

    hf = {a: statistics.median(res["hf_ms"] for res in results[a]) for a in results}
    print(f"\n{header(args)}; before = {args.before}, after = the working tree; median of "
          f"{args.rounds} interleaved rounds (min-max)\n")  # fmt: skip
    print(
        "| decoder | tree: nodes (depth) | before: ms a step | before: break-even τ "
        "| after: ms a step | after: break-even τ | after / before |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    print(f"| HF greedy | - | {hf['before']:.1f} | 1.00 | {hf['after']:.1f} | 1.00 | - |")
    for i, row in enumerate(results["after"][0]["rows"]):
        b, a = cell("before", i), cell("after", i)
        print(f"| {row['decoder']} | {row['tree']} | {b[0]:.1f} | {b[1]:.2f} ({b[2]:.2f}-"
              f"{b[3]:.2f}) | {a[0]:.1f} | {a[1]:.2f} ({a[2]:.2f}-{a[3]:.2f}) | "
              f"{a[1] / b[1] if b[1] > 0 else float('nan'):.2f} |")  # fmt: skip


def main() -> None:
    import json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--dtype", default=None, help="float32 (default for the CPU) or bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--before", default=None, help="a commit to measure against this tree")
    p.add_argument("--rounds", type=int, default=2, help="with --before: interleaved rounds")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # JSON out (before_after)
    args = p.parse_args()
    if args.worker:
        Path(args.worker).write_text(json.dumps(measure(args)))
        return
    if args.before:
        before_after(args)
        return
    res = measure(args)
    print(f"\n{header(args)}\n")
    print("| decoder | tree: nodes (depth) | ms a step | step / HF greedy step = break-even τ |")
    print("|---|---|---:|---:|")
    print(f"| HF greedy | - | {res['hf_ms']:.1f} | 1.00 |")
    for r in res["rows"]:
        print(f"| {r['decoder']} | {r['tree']} | {r['ms']:.1f} | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()
