"""What a decoding step costs, in plain greedy steps: the break-even τ of every drafter and tree.

    python benchmarks/decode_cost.py                       # SmolLM2, fp32, 1 thread, 3 prompts
    python benchmarks/decode_cost.py --threads 2 --max-new-tokens 96 --dtype bfloat16

A drafter pays only when its τ (new tokens per verification forward) exceeds the time of one of
its steps in HF greedy steps: that ratio is its break-even τ. Drafters here have random weights
(cost does not depend on what they learnt; they accept almost nothing, so every step is a full
tree step): Medusa (K = 4) and Cerberus (K = 4) over static trees, Falcon (k = 2) over its trees,
each at the default draft vocabulary (8,192). Step time = (time to n new tokens - time to 1 new
token) / verification forwards, per prompt, pooled over prompts (first user turns of MT-Bench
questions, one per category); HF greedy's step = the same difference / (n - 1). Every output is
checked against the in-house AR loop's (lossless), else the script stops.
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
    from drafters.eval.bench import load_questions

    path = ROOT / "drafters/eval/prompts/mt_bench_question.jsonl"
    qs = load_questions(path, "mt_bench", 1, 0)[:n]
    msgs = [[{"role": "user", "content": q["turns"][0]}] for q in qs]
    return [torch.tensor([render_prompt(target.tokenizer, m)]) for m in msgs]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def step_cost(decode, ids_list, n: int, refs) -> tuple[float, int]:
    """(seconds per verification forward, forwards) pooled over prompts; outputs checked."""
    seconds, forwards = 0.0, 0
    for ids, ref in zip(ids_list, refs, strict=True):
        t1, _ = timed(lambda ids=ids: decode(ids, 1))
        tn, res = timed(lambda ids=ids: decode(ids, n))
        if not torch.equal(res.sequences, ref):
            raise AssertionError("output differs from the AR loop's: a decoder bug")
        seconds += tn - t1
        forwards += res.verify_forwards
    return seconds / max(forwards, 1), forwards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="smollm2_135m")
    p.add_argument("--dtype", default=None, help="float32 (default for the CPU) or bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--draft-vocab", type=int, default=8192)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from drafters import load_target
    from drafters.decoding import decode_ar, decode_heads
    from drafters.decoding.falcon import decode_falcon
    from drafters.machine import processor_name
    from drafters.models import build_drafter
    from drafters.models.vocab import top_ids
    from drafters.training.run import drafter_config

    target = load_target(args.target, dtype=args.dtype)
    ids_list = prompts(target, args.prompts)
    n = args.max_new_tokens
    refs = [decode_ar(target, ids, n).sequences for ids in ids_list]

    def hf(ids, m):
        mask = torch.ones_like(ids)
        out = target.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=m)
        return SimpleNamespace(sequences=out, verify_forwards=out.shape[1] - ids.shape[1] - 1)

    hf_step, _ = step_cost(hf, ids_list, n, refs)
    rows = [("HF greedy", "-", hf_step, None)]
    ar_step, _ = step_cost(lambda ids, m: decode_ar(target, ids, m), ids_list, n, refs)
    rows.append(("AR loop", "-", ar_step, None))

    counts = torch.zeros(target.vocab_size)
    counts[: args.draft_vocab] = 1  # which ids does not matter for cost
    for kind in ("medusa", "cerberus", "falcon"):
        torch.manual_seed(0)
        cfg = drafter_config(kind, {"draft_vocab_size": args.draft_vocab}, target)
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

            step, fw = step_cost(decode, ids_list, n, refs)
            rows.append((kind, label, step, fw))
            print(f"[cost] {kind} {label}: {step * 1e3:.1f} ms a step", file=sys.stderr)

    cpu = processor_name()
    print(f"\n{args.target}, {target.dtype}, {args.threads} thread(s), {cpu}; "
          f"{len(ids_list)} MT-Bench first turns, {n} new tokens; random drafters, "
          f"V_d {args.draft_vocab}\n")  # fmt: skip
    print("| decoder | tree: nodes (depth) | ms a step | step / HF greedy step = break-even τ |")
    print("|---|---|---:|---:|")
    for kind, label, step, _ in rows:
        print(f"| {kind} | {label} | {step * 1e3:.1f} | {step / hf_step:.2f} |")


if __name__ == "__main__":
    main()
