"""Distillation engines on the embedded target: speed, and agreement between engines/dtypes.

    python benchmarks/bench_distill.py speed --engines hf:float32 hf_fast:float32 vllm:float32 \\
        --batch-sizes 16 32 64 --prompts 64 --max-new-tokens 256
    python benchmarks/bench_distill.py agreement --a hf:float32 --b vllm:bfloat16 --prompts 50

Prompts: the first user turns of the first `--prompts` ShareGPT training conversations that
fit in 1,024 tokens, rendered with the target's chat template (what `data/distill.py` sends).
An engine is `backend:dtype` (backends of `drafters.data.engines`; dtype float32 or bfloat16).

speed: generated tokens/s, counting each row's tokens up to and including its end of turn
(nothing after it), timed after a warm-up; the engine's start-up (vLLM compiles for minutes)
is reported apart. One markdown table.

agreement: both engines answer the same prompts greedily. Reports the share of answers that
are identical, the mean common prefix (tokens), and the label agreement: the share of B's answer
tokens that the fp32 HF target predicts (argmax) given B's own prefix, i.e. how many of the
training labels a B-made corpus holds are the fp32 target's own greedy choices.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from drafters.data.chat import render_prompt
from drafters.data.engines import Request, SamplingConfig, make_engine
from drafters.data.sharegpt import read_conversations
from drafters.target import load_target

MAX_PROMPT = 1024


def first_turn_prompts(tokenizer, n: int) -> list[list[int]]:
    prompts = []
    for conv in read_conversations("sharegpt-package", split="train"):
        users = [m for m in conv.messages if m["role"] == "user"][:1]
        ids = render_prompt(
            tokenizer, [m for m in conv.messages[:1] if m["role"] == "system"] + users
        )
        if len(ids) <= MAX_PROMPT:
            prompts.append(ids)
        if len(prompts) == n:
            return prompts
    return prompts


def engine_for(spec: str, batch_size: int, max_new_tokens: int):
    backend, _, dtype = spec.partition(":")
    dtype = dtype or "float32"
    device = "meta" if backend == "vllm" else "cpu"  # vLLM loads the weights itself
    target = load_target("smollm2_135m", dtype=dtype, device=device)
    t0 = time.perf_counter()
    engine = make_engine(backend, target, batch_size, MAX_PROMPT + max_new_tokens)
    return target, engine, time.perf_counter() - t0


def generate(engine, target, prompts, max_new_tokens) -> tuple[dict[str, list[int]], float]:
    sampling = SamplingConfig(max_new_tokens, tuple(target.eos_token_ids))
    out: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    requests = [Request(str(i), p) for i, p in enumerate(prompts)]
    engine.run(requests, sampling, lambda r, ids, fin: out.update({r.id: ids}) or [])
    return out, time.perf_counter() - t0


def speed(args) -> None:
    rows = []
    for spec in args.engines:
        for bs in args.batch_sizes:
            target, engine, startup = engine_for(spec, bs, args.max_new_tokens)
            with engine:
                prompts = first_turn_prompts(target.tokenizer, args.prompts)
                generate(engine, target, prompts[:2], 4)  # warm-up
                out, dt = generate(engine, target, prompts, args.max_new_tokens)
            tokens = sum(len(ids) for ids in out.values())
            rows.append((spec, bs, len(prompts), tokens, startup, dt, tokens / dt))
            print(f"{spec} batch {bs}: {tokens} tokens in {dt:.1f} s", flush=True)
    print(
        f"\nSmolLM2-135M-Instruct, {torch.get_num_threads()} torch threads, "
        f"max_new_tokens {args.max_new_tokens}, ShareGPT first turns\n"
    )
    print("| engine | batch | prompts | generated tokens | start-up s | seconds | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for spec, bs, n, tok, st, dt, tps in rows:
        print(f"| {spec} | {bs} | {n} | {tok} | {st:.0f} | {dt:.1f} | {tps:.1f} |")


@torch.no_grad()
def label_agreement(reference, prompts, answers) -> tuple[int, int]:
    """(tokens of `answers` equal to the reference's argmax given the same prefix, tokens)."""
    hit = total = 0
    for p, ids in zip(prompts, answers, strict=True):
        seq = torch.tensor([p + ids])
        logits = reference.model(seq).logits[0, len(p) - 1 : len(p) - 1 + len(ids)]
        hit += int((logits.argmax(-1) == torch.tensor(ids)).sum())
        total += len(ids)
    return hit, total


def agreement(args) -> None:
    answers, prompts = {}, None
    for spec in (args.b, args.a):  # B first: a vLLM start-up failure shows at once
        target, engine, _ = engine_for(spec, args.batch_size, args.max_new_tokens)
        with engine:
            prompts = prompts or first_turn_prompts(target.tokenizer, args.prompts)
            out, _ = generate(engine, target, prompts, args.max_new_tokens)
        answers[spec] = [out[str(i)] for i in range(len(prompts))]
    a, b = answers[args.a], answers[args.b]
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefix = []
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), None)
        prefix.append(min(len(x), len(y)) if n is None else n)
    reference = load_target("smollm2_135m", dtype="float32")
    hit, total = label_agreement(reference, prompts, b)
    result = {
        "a": args.a, "b": args.b, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "identical_answers": same, "mean_common_prefix": round(sum(prefix) / len(prefix), 1),
        "mean_tokens_a": round(sum(map(len, a)) / len(a), 1),
        "mean_tokens_b": round(sum(map(len, b)) / len(b), 1),
        "label_agreement_b_vs_fp32_hf": round(hit / total, 5),
    }  # fmt: skip
    print(json.dumps(result))
    print("\n| A | B | prompts | identical answers | mean common prefix (tokens) | "
          "mean length A / B | B's tokens = fp32 HF argmax |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    print(
        f"| {args.a} | {args.b} | {len(prompts)} | {same} ({same / len(prompts):.0%}) | "
        f"{result['mean_common_prefix']} | {result['mean_tokens_a']} / {result['mean_tokens_b']} "
        f"| {hit}/{total} ({hit / total:.2%}) |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--engines", nargs="+", default=["hf:float32", "hf_fast:float32"])
    s.add_argument("--batch-sizes", type=int, nargs="+", default=[32])
    s.add_argument("--prompts", type=int, default=64)
    s.add_argument("--max-new-tokens", type=int, default=256)
    a = sub.add_parser("agreement")
    a.add_argument("--a", default="hf:float32")
    a.add_argument("--b", default="vllm:bfloat16")
    a.add_argument("--prompts", type=int, default=50)
    a.add_argument("--max-new-tokens", type=int, default=256)
    a.add_argument("--batch-size", type=int, default=32)
    for q in (s, a):
        q.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    speed(args) if args.cmd == "speed" else agreement(args)


if __name__ == "__main__":
    main()
