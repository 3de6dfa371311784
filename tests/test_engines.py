"""Engine construction that needs no engine: vLLM's arguments, where its Python is found."""

import pytest

from drafters.data.engines import make_engine
from drafters.data.engines.vllm_client import VLLMError, engine_kwargs, vllm_python


def test_vllm_arguments_for_the_cpu_and_for_gpus(tiny):
    import copy

    tiny = copy.copy(tiny)
    tiny.path = "/models/tiny"
    cpu = engine_kwargs(tiny, 32, 1536, {"enforce_eager": True})
    assert cpu["model"] == "/models/tiny" and cpu["dtype"] == "float32"
    assert cpu["max_num_seqs"] == 32 and cpu["max_model_len"] == 1536
    assert cpu["kv_cache_memory_bytes"] == 2 * 2**30 and "gpu_memory_utilization" not in cpu
    assert cpu["generation_config"] == "vllm"  # the folder's sampling defaults never apply
    gpu = engine_kwargs(
        tiny, 256, 3072, {"kv_cache_gib": None, "tensor_parallel_size": 4, "dtype": "bfloat16"}
    )
    assert gpu["gpu_memory_utilization"] == 0.9 and "kv_cache_memory_bytes" not in gpu
    assert gpu["tensor_parallel_size"] == 4 and gpu["dtype"] == "bfloat16"


def test_a_missing_vllm_python_is_named(tmp_path):
    with pytest.raises(VLLMError, match="nowhere/python"):
        vllm_python(str(tmp_path / "nowhere" / "python"))


def test_an_unknown_backend_lists_the_known_ones(tiny):
    with pytest.raises(ValueError, match="hf, hf_fast, vllm"):
        make_engine("llamacpp", tiny, 4, 64)
