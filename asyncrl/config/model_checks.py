"""Checks of the model side of a config: LoRA, quantized rollout, and the trainer's data-parallel ranks."""

from __future__ import annotations

from asyncrl.config.errors import ConfigError, check
from asyncrl.config.schema import Config


def check_trainer_ranks(cfg: Config) -> None:
    t, r = cfg.trainer, cfg.rollout
    check_offload(cfg)
    check(
        t.num_workers == 1 or t.schedule != "sync" or r.engine != "vllm",
        "trainer.num_workers",
        t.num_workers,
        "1 with rollout.engine=vllm in the sync schedule (each data-parallel rank would start a vLLM engine of its "
        "own, which is not implemented; a separate rollout pool, trainer.schedule=one_step_off, works with any "
        "number of ranks)",
    )
    fs = cfg.actor.fsdp_config.fsdp_size
    check(
        fs in (-1, t.num_workers),
        "actor.fsdp_config.fsdp_size",
        fs,
        f"-1 or trainer.num_workers ({t.num_workers}): every trainer rank in one shard group (hybrid sharding, "
        "shards replicated across groups, is not built)",
    )
    if t.strategy == "fsdp2" and t.num_workers > 1:
        check(
            t.backend == "ray",
            "trainer.strategy",
            t.strategy,
            "ddp with trainer.backend=in_process: FSDP2 needs a default process group per rank, so its ranks must "
            "be processes (trainer.backend=ray), not threads of the driver",
        )
        check(
            not cfg.model.lora_rank,
            "trainer.strategy",
            t.strategy,
            "ddp with LoRA (model.lora_rank > 0): sharding a LoRA model with FSDP2 is not implemented (DDP "
            "replicates only the small adapter's gradients and optimizer state)",
        )


def check_offload(cfg: Config) -> None:
    """verl's actor offload keys act on FSDP2's shards: refused by name where nothing is sharded, or where torch
    cannot do what they ask. (``ref.fsdp_config.param_offload`` works either way: an unsharded reference waits on the
    host and is moved in for its pass.)"""
    t, fc = cfg.trainer, cfg.actor.fsdp_config
    sharded = t.strategy == "fsdp2" and t.num_workers > 1
    for key, on in (
        ("actor.fsdp_config.param_offload", fc.param_offload),
        ("actor.fsdp_config.optimizer_offload", fc.optimizer_offload),
    ):
        check(
            not on or sharded,
            key,
            on,
            "false unless trainer.strategy=fsdp2 with trainer.num_workers > 1: it offloads FSDP2's shards (DDP and "
            "one rank keep their weights and optimizer state where they train)",
        )
    check(
        fc.optimizer_offload == fc.param_offload,
        "actor.fsdp_config.optimizer_offload",
        fc.optimizer_offload,
        f"equal to actor.fsdp_config.param_offload ({fc.param_offload}): torch's FSDP2 CPUOffloadPolicy keeps a "
        "module's parameter, gradient and optimizer-state shards on the host together (the step runs there), so one "
        "cannot be offloaded without the other",
    )


def check_lora(cfg: Config) -> None:
    m = cfg.model
    check(m.lora_rank >= 0, "model.lora_rank", m.lora_rank, ">= 0 (0 = full fine-tuning)")
    check(m.lora_alpha > 0, "model.lora_alpha", m.lora_alpha, "> 0")
    t = m.target_modules
    ok = t == "all-linear" or (isinstance(t, list) and bool(t) and all(isinstance(x, str) and x for x in t))
    check(ok, "model.target_modules", t, '"all-linear" or a non-empty list of module names')
    if m.lora_adapter_path is not None and not m.lora_rank:
        raise ConfigError("model.lora_adapter_path is set but model.lora_rank is 0 (LoRA off): set the adapter's rank")


def check_rollout_dtype(cfg: Config) -> None:
    """The sync schedule's built-in engine decodes from the trainer's own weights, in ``model.dtype``."""
    r, m = cfg.rollout, cfg.model
    if cfg.trainer.schedule == "sync" and r.engine == "builtin" and r.dtype not in (None, m.dtype):
        raise ConfigError(
            f"rollout.dtype={r.dtype}: the sync schedule's built-in engine decodes from the trainer's own weights, in "
            f"model.dtype={m.dtype}; set rollout.dtype to null or {m.dtype}, or use rollout.engine=vllm (its own copy, "
            "in rollout.dtype) or a schedule with a rollout pool"
        )


def check_quantization(cfg: Config) -> None:
    q = cfg.rollout.quantization
    if q is None:
        return
    if cfg.model.lora_rank:
        raise ConfigError(
            "rollout.quantization=fp8 with model.lora_rank > 0 is not implemented (a LoRA sync carries only the "
            "adapter; quantizing the base for the rollout is not built)"
        )
    if cfg.trainer.schedule == "sync" and cfg.rollout.engine == "builtin":
        raise ConfigError(
            "rollout.quantization=fp8 with trainer.schedule=sync needs rollout.engine=vllm: the built-in engine "
            "decodes with the trainer's own weights in sync (use a schedule with a rollout pool, or vLLM)"
        )
