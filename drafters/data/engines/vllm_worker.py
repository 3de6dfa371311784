"""The vLLM side of the vLLM distillation backend: a child process that owns one engine.

Runs under the Python that has vLLM (`.venv-vllm/bin/python`, made by `make setup-vllm`: vLLM
pins its own torch and transformers), so it imports nothing from `drafters`, only the standard
library and vLLM. The parent (`drafters.data.engines.vllm_client`) speaks JSON lines over
stdin/stdout; vLLM's own logging goes to stderr.

Protocol, lock-step so that the engine's batches (and so its outputs) depend only on the
requests, never on timing:

    parent -> {"op": "init", "engine": {...LLM kwargs...}}       child -> {"ready": {version...}}
    parent -> {"op": "run", "requests": [{"id", "prompt", "seed"}], "sampling": {...}}
    child  -> {"done": [{"id", "ids", "finish"}]}   after every engine step that finished some
    parent -> {"add": [requests]}                   follow-ups (the next turns), maybe none
    ...                                             until nothing is left:
    child  -> {"idle": true}
    parent -> {"op": "exit"}

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a request added
between two steps joins the very next one. The prefix cache is reset at every "run": a shard's
outputs do not depend on the shards before it.
"""

from __future__ import annotations

import json
import os
import sys


def _send(obj) -> None:
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def _recv() -> dict:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)  # the parent went away
    return json.loads(line)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent dies, so a killed distillation never leaves
    an engine behind holding the cores (or a GPU)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main() -> None:
    _die_with_parent()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Everything vLLM prints goes to stderr; stdout carries the protocol only.
    sys.stdout = sys.stderr
    msg = _recv()
    if msg.get("op") != "init":
        raise SystemExit(f"vllm_worker: expected an init message, got {msg!r}")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**msg["engine"])
    engine = llm.llm_engine
    _send({"ready": {"engine": "vllm", "version": vllm.__version__}})
    while True:
        msg = _recv()
        if msg["op"] == "exit":
            return
        if msg["op"] != "run":
            raise SystemExit(f"vllm_worker: unknown op {msg['op']!r}")
        engine.reset_prefix_cache()
        sampling = msg["sampling"]
        stop_ids = set(sampling.get("stop_token_ids") or [])

        def add(requests, sampling=sampling):
            for r in requests:
                params = SamplingParams(**sampling, seed=r.get("seed"))
                engine.add_request(r["id"], TokensPrompt(prompt_token_ids=r["prompt"]), params)

        add(msg["requests"])
        while engine.has_unfinished_requests():
            done = []
            for out in engine.step():
                if not out.finished:
                    continue
                o = out.outputs[0]
                ids = list(o.token_ids)
                stopped = o.finish_reason == "stop"
                if stopped and (not ids or ids[-1] not in stop_ids):
                    if not isinstance(o.stop_reason, int):
                        raise SystemExit(f"vllm_worker: stop without a stop token: {o!r}")
                    ids.append(o.stop_reason)
                finish = "eos" if stopped else "length"
                done.append({"id": out.request_id, "ids": ids, "finish": finish})
            if done:
                _send({"done": done})
                add(_recv()["add"])
        _send({"idle": True})


if __name__ == "__main__":
    main()
