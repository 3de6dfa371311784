"""benchmarks/corpus_precision.py end to end on the tiny target: two distillations of the same
conversations (two answer lengths stand in for two engines), the same first batches of each
merged, one drafter trained on each and decoded beside the AR loop, a re-run that redoes
nothing."""

import json
import subprocess
import sys

from train_helpers import ROOT, tiny_overrides

from drafters.data.distillation import DistillConfig, run_distillation


def test_two_corpora_train_and_decode_on_their_common_batches(tmp_path, tiny_distilled, tiny):
    other = tmp_path / "other" / "train"
    source = str(tiny_distilled.parent / "conversations.jsonl")
    run_distillation(tiny, source, other, DistillConfig(max_new_tokens=12, batch_size=8),
                     split=None)  # fmt: skip
    over = [o for o in tiny_overrides(tmp_path, tiny_distilled)
            if not o.startswith(("paths.", "data.dataset_dir", "data.cache_dir"))]  # fmt: skip
    cmd = [
        sys.executable, "benchmarks/corpus_precision.py", "--corpora", f"a={tiny_distilled}",
        f"b={other}", "--batches", "2", "--prompts", "2", "--max-new-tokens", "12",
        "--target", "tiny", "--depth", "2", "--val-fraction", "0.25", "--max-length", "64",
        "--log-dir", str(tmp_path / "logs"),
        "--out", str(tmp_path / "out"), *over, "drafter.model.draft_vocab_size=64",
        "data.features=offline",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {n: json.loads((tmp_path / "out" / f"{n}.json").read_text()) for n in "ab"}
    assert rows["a"]["conversations"] == rows["b"]["conversations"] == 16  # 2 batches of 8
    assert rows["a"]["answer_tokens"] != rows["b"]["answer_tokens"]  # other answers
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in res.stdout.splitlines()
             if line.startswith(("| a |", "| b |"))}  # fmt: skip
    assert table["a"][4] == "16/16 (16.0)"  # the first corpus is the one compared with
    assert table["b"][4] == "0/16 (12.0)"  # every answer cut at 12 tokens, the same 12 first
    for name in "ab":  # both drafters rated on a's held-out answers, per depth
        rates = table[name][-1].strip(" |").split()
        assert len(rates) == 2 * 2 and all(0 <= float(x) <= 1 for x in rates)  # Falcon k=2
    for name, row in rows.items():
        assert row["lossless"] and row["tau"] >= 1.0 and len(row["accept_at_depth"]) == 2
        assert f"| {name} | hf " in res.stdout
    assert (tmp_path / "out" / "b" / "features" / "train" / "meta.json").is_file()  # offline
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "[precision] " not in again.stdout  # nothing redone


def test_a_corpus_without_the_batches_is_refused(tmp_path, tiny_distilled):
    cmd = [sys.executable, "benchmarks/corpus_precision.py", "--corpora", f"a={tiny_distilled}",
           "--batches", "9", "--target", "tiny", "--out", str(tmp_path / "out")]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode != 0 and "are not distilled yet" in res.stderr
