"""The one place that turns ``rollout.engine`` into an engine object (the built-in decode loop or vLLM)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from asyncrl.config.rollout import engine_dtype
from asyncrl.config.specs import EngineSpec
from asyncrl.models.loading import load_model, load_tokenizer_from
from asyncrl.models.lora import LoraSpec, apply_lora
from asyncrl.rollout.agent.engine import AgentEngine
from asyncrl.rollout.engine import RolloutEngine


def builtin_engine(spec: EngineSpec, model: PreTrainedModel, tokenizer, quantization: str | None = None) -> AgentEngine:
    """The built-in decode loop over ``model``, behind the agent loops (``asyncrl.rollout.agent``): single-turn rows
    decode as the engine alone would, a row whose agent (``agent_name``, else ``rollout.agent.default_agent_loop``)
    goes on runs several turns."""
    r = spec.rollout
    engine = RolloutEngine(
        model,
        tokenizer,
        max_batch_size=r.max_batch_size,
        share_prefixes=r.enable_prefix_caching,
        quantization=quantization,
    )
    return AgentEngine(engine, r.multi_turn, r.agent.default_agent_loop)


def rollout_engine(spec: EngineSpec, device: torch.device | None = None) -> AgentEngine:
    """A rollout worker's engine over its own copy of ``model.path`` on ``device`` (a vLLM engine never loads the HF
    model: it places itself), behind the agent loops."""
    m = spec.model
    if spec.rollout.engine == "vllm":
        from asyncrl.rollout.vllm_engine import VllmEngine, VllmOptions

        engine = VllmEngine(m.path, load_tokenizer_from(m.path), VllmOptions.from_spec(spec), lora=LoraSpec.of(m))
        return AgentEngine(engine, spec.rollout.multi_turn, spec.rollout.agent.default_agent_loop)
    on_gpu = device is not None and device.type == "cuda"
    dtype = engine_dtype(spec.rollout.dtype, m.dtype, on_gpu)  # rollout.dtype: the trainer keeps model.dtype
    model, tokenizer = load_model(m.path, dtype=dtype, for_training=False, overrides=m.override_config)
    lora = LoraSpec.of(m)
    if lora is not None:  # the trainer's adapter arrives at each sync; decode with it merged into the base weights
        model = apply_lora(model, lora, trainable=False)
        model.merge_adapter()
    if device is not None:
        model.to(device)
    return builtin_engine(spec, model, tokenizer, quantization=spec.rollout.quantization)


def colocated_engine(spec: EngineSpec, model: PreTrainedModel, tokenizer, is_rollout: bool) -> AgentEngine:
    """The trainer's engine, behind the agent loops. ``is_rollout`` (the sync schedule): it generates the batches,
    with vLLM fed in-process from ``model`` when ``rollout.engine=vllm`` (in ``rollout.dtype``, on the trainer's GPU:
    a colocated share of it); else it only evaluates, with the built-in loop over ``model``, in the trainer's own
    dtype (it decodes from the trained weights themselves: a ``rollout.dtype`` other than ``model.dtype`` is refused
    at load for the sync schedule's built-in engine, ``asyncrl.config.checks``)."""
    r = spec.rollout
    if r.engine == "vllm" and is_rollout:
        from asyncrl.rollout.vllm_engine import VllmEngine, VllmOptions

        options = VllmOptions.from_spec(spec, colocated=True)
        engine = VllmEngine(spec.model.path, tokenizer, options, source=model, lora=LoraSpec.of(spec.model))
        return AgentEngine(engine, r.multi_turn, r.agent.default_agent_loop)
    return builtin_engine(spec, model, tokenizer)
