"""The one place that turns ``rollout.engine`` into an engine object (the built-in decode loop or vLLM)."""

from __future__ import annotations

from transformers import PreTrainedModel

from asyncrl.config import Config
from asyncrl.models.loading import load_model, load_tokenizer_from
from asyncrl.models.lora import LoraSpec, apply_lora
from asyncrl.rollout.agent.loop import AgentEngine
from asyncrl.rollout.engine import RolloutEngine


def builtin_engine(cfg: Config, model: PreTrainedModel, tokenizer, quantization: str | None = None) -> RolloutEngine:
    r = cfg.rollout
    return RolloutEngine(
        model, tokenizer, max_batch_size=r.max_batch_size, share_prefixes=r.enable_prefix_caching,
        quantization=quantization,
    )  # fmt: skip


def with_agent_loops(cfg: Config, engine):
    """``engine`` behind the agent loops (``asyncrl.rollout.agent``): single-turn rows decode as before, a row whose
    agent (``agent_name``, else ``rollout.agent.default_agent_loop``) is the tool agent runs several turns."""
    return AgentEngine(engine, cfg.rollout.multi_turn, cfg.rollout.agent.default_agent_loop)


def rollout_engine(cfg: Config):
    """A rollout worker's engine over its own copy of ``model.path`` (a vLLM engine never loads the HF model), behind
    the agent loops."""
    return with_agent_loops(cfg, _rollout_engine(cfg))


def _rollout_engine(cfg: Config):
    if cfg.rollout.engine == "vllm":
        from asyncrl.rollout.vllm_engine import VllmEngine, VllmOptions

        return VllmEngine(
            cfg.model.path, load_tokenizer_from(cfg.model.path), VllmOptions.from_config(cfg),
            lora=LoraSpec.from_config(cfg),
        )  # fmt: skip
    model, tokenizer = load_model(
        cfg.model.path, dtype=cfg.model.dtype, for_training=False, overrides=cfg.model.override_config
    )
    lora = LoraSpec.from_config(cfg)
    if lora is not None:  # the trainer's adapter arrives at each sync; decode with it merged into the base weights
        model = apply_lora(model, lora, trainable=False)
        model.merge_adapter()
    return builtin_engine(cfg, model, tokenizer, quantization=cfg.rollout.quantization)


def colocated_engine(cfg: Config, model: PreTrainedModel, tokenizer):
    """The trainer's engine, behind the agent loops: in the sync schedule it is the rollout (vLLM fed in-process from
    ``model`` when ``rollout.engine=vllm``); in the other schedules it only evaluates, with the built-in loop over
    ``model``."""
    if cfg.rollout.engine == "vllm" and cfg.trainer.schedule == "sync":
        from asyncrl.rollout.vllm_engine import VllmEngine, VllmOptions

        return with_agent_loops(
            cfg,
            VllmEngine(
                cfg.model.path, tokenizer, VllmOptions.from_config(cfg), source=model, lora=LoraSpec.from_config(cfg)
            ),
        )
    return with_agent_loops(cfg, builtin_engine(cfg, model, tokenizer))
