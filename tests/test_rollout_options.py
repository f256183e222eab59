"""The engine options a run resolves by device (``asyncrl.rollout.vllm_options``): pure functions of the options
and ``on_gpu``, so the GPU side is checked here on the CPU (it has not run on a GPU with vLLM)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoConfig

from asyncrl.config.schema import ModelConfig, RolloutConfig
from asyncrl.config.specs import EngineSpec
from asyncrl.rollout.factory import EngineDtypeError, colocated_engine
from asyncrl.rollout.vllm_options import (
    COLOCATED_SHARE,
    GPU_SHARE,
    EngineMemoryError,
    VllmOptions,
    check_weights_fit,
    eager,
    engine_dtype,
    gpu_share,
    kv_bytes_per_token,
    memory_options,
)

GIB = 2**30


def test_engine_dtype_is_bfloat16_on_a_gpu_and_the_trainers_on_the_cpu_unless_rollout_dtype_says():
    assert engine_dtype(None, "float32", on_gpu=True) == "bfloat16"
    assert engine_dtype(None, "float32", on_gpu=False) == "float32"
    assert engine_dtype("float16", "float32", on_gpu=True) == "float16"
    assert engine_dtype("bfloat16", "float32", on_gpu=False) == "bfloat16"


def test_cuda_graphs_are_on_by_default_on_a_gpu_and_off_on_the_cpu():
    assert eager(VllmOptions(), on_gpu=True) is False
    assert eager(VllmOptions(), on_gpu=False) is True
    assert eager(VllmOptions(enforce_eager=True), on_gpu=True) is True
    assert eager(VllmOptions(enforce_eager=False), on_gpu=False) is False


def test_gpu_share_defaults_to_most_of_a_gpu_of_its_own_and_leaves_the_trainer_room_when_shared():
    assert gpu_share(VllmOptions()) == GPU_SHARE == 0.8
    assert gpu_share(VllmOptions(colocated=True)) == COLOCATED_SHARE < 1 - COLOCATED_SHARE
    assert gpu_share(VllmOptions(colocated=True, gpu_memory_utilization=0.3)) == 0.3
    on_gpu = memory_options(VllmOptions(colocated=True, enable_chunked_prefill=False), on_gpu=True)
    assert on_gpu == {"gpu_memory_utilization": COLOCATED_SHARE, "enable_chunked_prefill": False}
    on_cpu = memory_options(VllmOptions(max_num_seqs=4, max_model_len=32), on_gpu=False)
    assert "enable_chunked_prefill" not in on_cpu and on_cpu["max_num_batched_tokens"] == 4 * 32


def test_options_from_a_run_config_carry_the_rollout_keys(tmp_path: Path):
    rollout = RolloutConfig(dtype="bfloat16", enable_chunked_prefill=False, gpu_memory_utilization=0.6)
    spec = EngineSpec(ModelConfig(path=str(tmp_path), dtype="float32"), rollout, 64, 0)
    opts = VllmOptions.from_spec(spec, colocated=True)
    assert (opts.dtype, opts.model_dtype, opts.enable_chunked_prefill) == ("bfloat16", "float32", False)
    assert opts.colocated and gpu_share(opts) == 0.6


def _qwen7b_like() -> AutoConfig:
    """Qwen2.5-7B's shape (28 layers, 4 KV heads of 128): config only, nothing allocated."""
    return AutoConfig.for_model(
        "qwen2", hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=28
    )


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer():
    assert kv_bytes_per_token(_qwen7b_like(), "bfloat16") == 2 * 28 * 4 * 128 * 2


def test_a_share_that_cannot_hold_the_weights_is_refused_in_one_line_naming_the_key():
    kv = kv_bytes_per_token(_qwen7b_like(), "bfloat16")
    weights, device = int(15.2 * GIB), 80 * GIB  # 7.6e9 parameters in bfloat16 on an 80 GB GPU
    opts = VllmOptions(dtype="bfloat16", max_model_len=9216)
    check_weights_fit(opts, weights, kv, device, on_gpu=True)  # the default 0.8: 64 GiB
    with pytest.raises(EngineMemoryError) as e:
        check_weights_fit(replace(opts, gpu_memory_utilization=0.05), weights, kv, device, on_gpu=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rollout.gpu_memory_utilization=0.05") and ">= 0.20" in msg
    fp32 = VllmOptions(model_dtype="float32", dtype="float32", gpu_memory_utilization=0.2)
    with pytest.raises(EngineMemoryError, match="rollout.dtype=bfloat16"):
        check_weights_fit(fp32, 2 * weights, kv * 2, device, on_gpu=True)
    check_weights_fit(replace(opts, gpu_memory_utilization=0.01), weights, kv, device, on_gpu=False)  # CPU: KV share


def test_the_sync_schedules_builtin_engine_refuses_a_rollout_dtype_it_cannot_decode_in():
    spec = EngineSpec(ModelConfig(path="m", dtype="float32"), RolloutConfig(dtype="bfloat16"), 64, 0)
    with pytest.raises(EngineDtypeError, match="rollout.dtype=bfloat16"):
        colocated_engine(spec, None, None, is_rollout=True)  # type: ignore[arg-type]
