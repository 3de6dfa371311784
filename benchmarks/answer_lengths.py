"""How often a `max_new_tokens` cap would cut the answers of a distillation, and how many of
the uncut-by-EOS answers loop. Reads a distillation folder's batch files (no model needed).

    python data/distill.py generation.backend=vllm max_conversations=96 generation.max_turns=1 \\
        generation.max_new_tokens=1536 generation.batch_size=64 out_dir=/tmp/lengths
    python benchmarks/answer_lengths.py /tmp/lengths --caps 256 384 512 768 1024 1536

An answer is cut at cap C if it is longer than C, or reached C without an end of turn. It
loops if its last 400 tokens hold fewer than 200 distinct 8-grams.
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--caps", type=int, nargs="+", default=[256, 384, 512, 768, 1024, 1536])
    args = p.parse_args()
    answers = []
    for path in sorted((Path(args.out_dir) / "shards").glob("batch-*.json")):
        for r in json.loads(path.read_text())["records"]:
            answers += list(zip(r["response_ids"], r["finish"], strict=True))
    if not answers:
        raise SystemExit(f"error: no batch files in {args.out_dir}/shards")
    ended = [len(ids) for ids, fin in answers if fin == "eos"]
    never = [ids for ids, fin in answers if fin == "length"]
    loops = sum(len({tuple(ids[-400:][i : i + 8]) for i in range(len(ids[-400:]) - 8)}) < 200
                for ids in never)  # fmt: skip
    print(f"{len(answers)} answers; {len(ended)} ended, the longest after {max(ended, default=0)}"
          f" tokens; {len(never)} never ended, {loops} of them loop\n")  # fmt: skip
    print("| max_new_tokens | answers cut | cut rate | answer tokens kept |")
    print("|---:|---:|---:|---:|")
    for cap in args.caps:
        cut = sum(
            1 for ids, fin in answers if len(ids) > cap or (fin == "length" and len(ids) >= cap)
        )
        kept = sum(min(len(ids), cap) for ids, _ in answers)
        print(f"| {cap} | {cut} | {cut / len(answers):.1%} | {kept} |")


if __name__ == "__main__":
    main()
