"""What a config section cannot check alone, run once at load after every section checked its own fields.

A section the chosen schedule never reads is an error naming it, and so is a key whose meaning depends on a choice
not made; one section's value bounds another's (``actor.ppo_mini_batch_size`` divides ``data.train_batch_size``).
What holds for the chosen algorithm (a ``teacher:`` block in a GRPO run, ``rollout.n`` for DPO) is the algorithm's
own: it declares what it reads and checks its rules (``asyncrl.algorithms.check_config``, run before a run starts).
"""

from __future__ import annotations

from asyncrl.config.algorithm_section import check_algorithm_name
from asyncrl.config.errors import ConfigError, check
from asyncrl.config.resources import resolve_ranks
from asyncrl.config.schema import AsyncTrainingConfig, Config


def validate(cfg: Config) -> None:
    """Every section's own checks, then what spans sections."""
    cfg.check_sections()
    resolve_ranks(cfg)
    check_algorithm_name(cfg.algorithm.name)
    d, a = cfg.data, cfg.actor
    if cfg.trainer.schedule != "fully_async":  # fully_async's step: require_batches x ppo_mini_batch_size groups
        allowed = f"a divisor of data.train_batch_size ({d.train_batch_size})"
        ok = d.train_batch_size % a.ppo_mini_batch_size == 0
        check(ok, "actor.ppo_mini_batch_size", a.ppo_mini_batch_size, allowed)
    _check_rollout_model(cfg)
    _check_trainer_ranks(cfg)
    _check_async_training(cfg)
    _check_dynamic_sampling(cfg)
    _check_reward_shaping(cfg)
    _check_sections_read(cfg)  # after the ranges: a bad value is named even in a section the run would not read


def _check_dynamic_sampling(cfg: Config) -> None:
    """``algorithm.filter_groups`` and ``data.gen_batch_size``: what the batch schedules' dynamic sampling
    (``asyncrl.run.generation``) can honour. The keys are accepted while ``enable`` is false, as verl's
    DAPO scripts set them whether or not they turn it on."""
    fg, d, schedule = cfg.algorithm.filter_groups, cfg.data, cfg.trainer.schedule
    if schedule == "fully_async":
        check(
            fg.max_num_gen_batches == 0,
            "algorithm.filter_groups.max_num_gen_batches",
            fg.max_num_gen_batches,
            "0 when trainer.schedule=fully_async (its Rollouter streams groups and drops each one without a reward "
            "spread as it finishes; there are no generation batches to count)",
        )
        check(
            d.gen_batch_size is None,
            "data.gen_batch_size",
            d.gen_batch_size,
            "null when trainer.schedule=fully_async (its Rollouter admits one group at a time)",
        )
    if not fg.enable:
        check(
            d.gen_batch_size in (None, d.train_batch_size),
            "data.gen_batch_size",
            d.gen_batch_size,
            f"null or data.train_batch_size ({d.train_batch_size}) unless algorithm.filter_groups.enable is true "
            "(without dynamic sampling every generated prompt is trained)",
        )
        return
    skip = cfg.rollout.skip
    if skip.enable and skip.action == "repeat":
        raise ConfigError(
            "config keys algorithm.filter_groups.enable and rollout.skip.action: dynamic sampling cannot run with "
            "rollout.skip.action=repeat (replaying one dump for every generation batch would train its groups twice "
            "in one batch, and a dump without a group to keep would never fill one); use rollout.skip.action=cache "
            "or turn one of them off"
        )


def _check_reward_shaping(cfg: Config) -> None:
    """The DAPO reward manager's overlong penalty: its buffer fits in the response."""
    kw = cfg.reward_model.reward_kwargs
    ob, key = kw.overlong_buffer_cfg, "reward_model.reward_kwargs.overlong_buffer_cfg"
    if not ob.enable:
        return
    max_resp_len = kw.max_resp_len_for(cfg.rollout.response_length)
    where = "reward_model.reward_kwargs.max_resp_len" if kw.max_resp_len else "rollout.response_length"
    check(ob.len <= max_resp_len, f"{key}.len", ob.len, f"<= the max_resp_len it ends at ({where}: {max_resp_len})")


def _check_sections_read(cfg: Config) -> None:
    """A section the chosen schedule never reads is an error, not silently ignored (the algorithm's sections:
    ``asyncrl.algorithms.check_config``)."""
    if cfg.trainer.schedule != "fully_async" and cfg.async_training != AsyncTrainingConfig():
        raise ConfigError(
            f"config section async_training: set, but trainer.schedule={cfg.trainer.schedule} never reads it (only "
            "fully_async does); remove it or set trainer.schedule=fully_async"
        )
    if cfg.trainer.schedule != "sync":
        return
    r = cfg.rollout
    if r.num_workers != 1 or r.cpus_per_worker != 1.0:
        raise ConfigError(
            "config keys rollout.num_workers / rollout.cpus_per_worker: set, but trainer.schedule=sync generates on "
            "the trainer's own worker (no rollout pool); remove them or pick a schedule with a rollout pool"
        )


def _check_async_training(cfg: Config) -> None:
    at, a, key = cfg.async_training, cfg.actor, "async_training."
    groups_per_step = at.require_batches * a.ppo_mini_batch_size
    check(
        at.max_queue_size is None or at.max_queue_size >= groups_per_step,
        key + "max_queue_size",
        at.max_queue_size,
        f">= require_batches * actor.ppo_mini_batch_size = {groups_per_step} groups (one trainer step), or null",
    )
    if cfg.trainer.schedule != "fully_async":
        return
    t = cfg.trainer
    check(
        not cfg.rollout.skip.enable,
        "rollout.skip.enable",
        cfg.rollout.skip.enable,
        "false with trainer.schedule=fully_async (its Rollouter streams groups, not per-step batches)",
    )
    check(
        t.critic_warmup == 0,
        "trainer.critic_warmup",
        t.critic_warmup,
        "0 when trainer.schedule=fully_async (the staleness budget needs a new policy version every "
        "async_training.trigger_parameter_sync_step steps; a warm-up step does not update the policy)",
    )
    k = at.trigger_parameter_sync_step
    check(
        t.save_freq <= 0 or t.save_freq % k == 0,
        "trainer.save_freq",
        t.save_freq,
        f"a multiple of async_training.trigger_parameter_sync_step ({k}): checkpoints are taken at weight syncs",
    )
    check(
        t.total_training_steps % k == 0,
        "trainer.total_training_steps",
        t.total_training_steps,
        f"a multiple of async_training.trigger_parameter_sync_step ({k}): the run ends at a weight sync",
    )
    check(
        not at.compute_prox_log_prob or cfg.algorithm.rollout_correction.rollout_is not in (None, "disabled"),
        "algorithm.rollout_correction.rollout_is",
        cfg.algorithm.rollout_correction.rollout_is,
        "token or sequence when async_training.compute_prox_log_prob is true (decoupled PPO weights every "
        "sample by its truncated behaviour->proximal ratio)",
    )
    check(
        not (at.compute_prox_log_prob and a.use_rollout_log_probs),
        key + "compute_prox_log_prob",
        at.compute_prox_log_prob,
        "false when actor.use_rollout_log_probs is true (bypass and decoupled PPO are alternatives)",
    )


def _check_trainer_ranks(cfg: Config) -> None:
    t, r = cfg.trainer, cfg.rollout
    _check_offload(cfg)
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


def _check_offload(cfg: Config) -> None:
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


def _check_rollout_model(cfg: Config) -> None:
    """An fp8 rollout syncs the whole base model; the sync schedule's built-in engine decodes from the trainer's own
    weights, in ``model.dtype``."""
    r, m = cfg.rollout, cfg.model
    sync_builtin = cfg.trainer.schedule == "sync" and r.engine == "builtin"
    if r.quantization is not None and m.lora_rank:
        raise ConfigError(
            "rollout.quantization=fp8 with model.lora_rank > 0 is not implemented (a LoRA sync carries only the "
            "adapter; quantizing the base for the rollout is not built)"
        )
    if r.quantization is not None and sync_builtin:
        raise ConfigError(
            "rollout.quantization=fp8 with trainer.schedule=sync needs rollout.engine=vllm: the built-in engine "
            "decodes with the trainer's own weights in sync (use a schedule with a rollout pool, or vLLM)"
        )
    if sync_builtin and r.dtype not in (None, m.dtype):
        raise ConfigError(
            f"rollout.dtype={r.dtype}: the sync schedule's built-in engine decodes from the trainer's own weights, in "
            f"model.dtype={m.dtype}; set rollout.dtype to null or {m.dtype}, or use rollout.engine=vllm (its own copy, "
            "in rollout.dtype) or a schedule with a rollout pool"
        )
