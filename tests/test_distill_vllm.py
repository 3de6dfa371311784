"""The vLLM backend end to end on the embedded target: `python data/distill.py` killed with
SIGKILL mid-run (engine child included) and resumed ends with the uninterrupted run's dataset,
and what vLLM generated is kept verbatim and agrees with the HF reference path."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drafters.data.corpus import load_distilled

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("needs_vllm")]


def command(out, tmp_path, backend="vllm", **extra):
    args = {
        "generation.backend": backend,
        "max_conversations": 6,
        "generation.max_new_tokens": 40,
        "generation.batch_size": 4,
        "generation.batch_conversations": 2,  # 3 batch files, so a kill can land between
        "generation.vllm.enforce_eager": "true",  # starts in ~30 s instead of ~2 min
        "out_dir": out,
        "paths.log_dir": tmp_path / "logs",
        **extra,
    }
    return [sys.executable, str(ROOT / "data" / "distill.py")] + [
        f"{k}={v}" for k, v in args.items()
    ]


def run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def rows(out):
    ds, meta = load_distilled(out)
    return ds.to_list(), meta


def test_vllm_distillation_killed_and_resumed_equals_an_uninterrupted_run(tmp_path, smollm2):
    whole = tmp_path / "whole"
    run(command(whole, tmp_path))

    resumed = tmp_path / "resumed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command(resumed, tmp_path), env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    first = resumed / "shards" / "batch-000000.json"
    deadline = time.time() + 600
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first batch never finished"
    os.killpg(proc.pid, signal.SIGKILL)  # the distillation and its vLLM child, mid-run
    proc.wait()
    assert not (resumed / "dataset").exists()
    res = run(command(resumed, tmp_path))
    assert "resuming: " in res.stdout

    got, meta = rows(resumed)
    want, _ = rows(whole)
    assert got == want and len(got) == 6
    engine = meta["distill"]["engine"]
    assert engine["engine"] == "vllm" and engine["dtype"] == "float32" and engine["version"]

    # verbatim ids: an "eos" answer ends with the end-of-turn id, its text is the decoded ids
    eos = set(smollm2.eos_token_ids)
    tok = smollm2.tokenizer
    for r in got:
        for msg, ids, fin in zip(r["messages"][1::2], r["response_ids"], r["finish"], strict=1):
            assert (ids[-1] in eos) == (fin == "eos") and len(ids) <= 40
            body = ids[:-1] if fin == "eos" else ids
            assert msg["content"] == tok.decode(body, skip_special_tokens=True)

    # the same job on the HF reference path (fp32): vLLM fp32 gives the same answers here
    hf = tmp_path / "hf"
    run(command(hf, tmp_path, backend="hf"))
    ref, _ = rows(hf)
    same = sum(a["response_ids"] == b["response_ids"] for a, b in zip(got, ref, strict=True))
    assert same >= 5, f"vLLM fp32 and HF fp32 agree on {same} of 6 conversations"
