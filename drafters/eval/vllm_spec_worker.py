"""The vLLM side of `drafters.eval.vllm_bench`: one engine per method, prompts one at a time.

Runs under the Python that has vLLM (`.venv-vllm/bin/python`), so it imports only the standard
library and vLLM, never `drafters`.

    python vllm_spec_worker.py JOB.json RESULT.json

JOB.json: {"engine": {...vllm.LLM kwargs, without speculative_config...},
           "methods": [{"name": str, "speculative_config": null | {...}}],
           "prompts": [[token ids], ...], "sampling": {...SamplingParams kwargs...},
           "warmup": n}
RESULT.json (rewritten after each method): {"vllm": version, "methods": {name: {
    "load_s": seconds to build the engine, "runs": [{"ids": generated ids, "seconds": wall time
    of generate(), "drafts", "draft_tokens", "accepted": spec-decode counters over this prompt
    (0 without speculation), "accepted_per_pos": [...]}]}}}

Every prompt is its own `generate` call (batch 1); the first `warmup` prompts run once before
timing. The prefix cache is off, so no prompt reuses another's work.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict:
    out = {v: 0 for v in COUNTERS.values()}
    out["accepted_per_pos"] = []
    for m in llm.get_metrics():
        name = m.name.removesuffix("_total")
        if name in COUNTERS:
            out[COUNTERS[name]] += int(m.value)
        elif name == PER_POS:
            out["accepted_per_pos"] = [int(v) for v in m.values]
    return out


def diff(after: dict, before: dict) -> dict:
    d = {k: after[k] - before[k] for k in COUNTERS.values()}
    a, b = after["accepted_per_pos"], before["accepted_per_pos"]
    b = b + [0] * (len(a) - len(b))
    d["accepted_per_pos"] = [x - y for x, y in zip(a, b[: len(a)], strict=True)]
    return d


def write(path: str, obj) -> None:
    tmp = path + ".partial"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def main(job_path: str, result_path: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.load(open(job_path))
    result = {"vllm": vllm.__version__, "methods": {}}
    params = SamplingParams(**job["sampling"])
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    for method in job["methods"]:
        t0 = time.perf_counter()
        kwargs = dict(job["engine"], enable_prefix_caching=False, disable_log_stats=False)
        if method.get("speculative_config"):
            kwargs["speculative_config"] = method["speculative_config"]
        llm = LLM(**kwargs)
        load_s = time.perf_counter() - t0
        for p in prompts[: int(job.get("warmup", 0))]:
            llm.generate([p], params, use_tqdm=False)
        runs = []
        for p in prompts:
            before = spec_counters(llm)
            t = time.perf_counter()
            out = llm.generate([p], params, use_tqdm=False)[0].outputs[0]
            seconds = time.perf_counter() - t
            runs.append(
                {"ids": list(out.token_ids), "seconds": seconds, **diff(spec_counters(llm), before)}
            )
        result["methods"][method["name"]] = {"load_s": load_s, "runs": runs}
        write(result_path, result)
        del llm
        gc.collect()


if __name__ == "__main__":
    sys.stdout = sys.stderr  # vLLM's chatter; the result goes to the file
    main(sys.argv[1], sys.argv[2])
