"""What a config section cannot check alone, run once at load after every section checked its own fields.

A section the chosen algorithm or schedule never reads is an error naming it (a ``teacher:`` block in a GRPO run
would otherwise be silently ignored), and so is a key whose meaning depends on a choice not made; one section's value
bounds another's (``actor.ppo_mini_batch_size`` divides ``data.train_batch_size``).
"""

from __future__ import annotations

import re

from asyncrl.config.errors import ConfigError, check
from asyncrl.config.model_checks import check_lora, check_quantization, check_rollout_dtype, check_trainer_ranks
from asyncrl.config.resources import resolve_ranks
from asyncrl.config.schema import (
    ALGORITHMS,
    AsyncTrainingConfig,
    Config,
    CriticConfig,
    DistillConfig,
    DpoConfig,
    RefConfig,
    RewardModelConfig,
    TeacherConfig,
)

MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")  # an algorithm of the user's: a dotted module path
# What each algorithm needs besides the policy, and the sections only it reads.
ALGORITHM_SECTIONS = {
    "grpo": (),
    "ppo": ("critic", "reward_model"),
    "distill": ("teacher", "distill"),
    "dpo": ("dpo",),
}
SECTION_DEFAULTS = {  # reward_model is checked apart: its reward manager is every algorithm's
    "critic": CriticConfig,
    "teacher": TeacherConfig,
    "distill": DistillConfig,
    "dpo": DpoConfig,
}
ESTIMATORS = {"grpo": ("grpo",), "ppo": ("gae",), "distill": (), "dpo": ()}


def validate(cfg: Config) -> None:
    """Every section's own checks, then what spans sections."""
    cfg.check_sections()
    resolve_ranks(cfg)
    check(
        cfg.algorithm.name in ALGORITHMS or MODULE_PATH.fullmatch(cfg.algorithm.name) is not None,
        "algorithm.name",
        cfg.algorithm.name,
        f"one of {', '.join(ALGORITHMS)}, or the import path of a module of yours that names its Algorithm subclass "
        "ALGORITHM (my_pkg.my_algo)",
    )
    d, a = cfg.data, cfg.actor
    if cfg.trainer.schedule != "fully_async":  # fully_async's step: require_batches x ppo_mini_batch_size groups
        allowed = f"<= data.train_batch_size ({d.train_batch_size})"
        check(a.ppo_mini_batch_size <= d.train_batch_size, "actor.ppo_mini_batch_size", a.ppo_mini_batch_size, allowed)
        allowed = f"a divisor of data.train_batch_size ({d.train_batch_size})"
        ok = d.train_batch_size % a.ppo_mini_batch_size == 0
        check(ok, "actor.ppo_mini_batch_size", a.ppo_mini_batch_size, allowed)
    check_lora(cfg)
    check_quantization(cfg)
    check_rollout_dtype(cfg)
    check_trainer_ranks(cfg)
    _check_async_training(cfg)
    _check_algorithm(cfg)
    _check_dynamic_sampling(cfg)
    _check_reward_shaping(cfg)
    _check_sections_read(cfg)  # after the ranges: a bad value is named even in a section the run would not read


def _check_algorithm(cfg: Config) -> None:
    """What holds only for the chosen algorithm."""
    name = cfg.algorithm.name
    if name == "dpo":
        check(cfg.rollout.n >= 2, "rollout.n", cfg.rollout.n, ">= 2 when algorithm.name=dpo (a pair needs two samples)")
        check(
            not cfg.actor.use_kl_loss,
            "actor.use_kl_loss",
            cfg.actor.use_kl_loss,
            "false when algorithm.name=dpo (DPO's loss already holds the policy to its reference, dpo.beta)",
        )
        check(
            cfg.dpo.ref_update_freq == 0 or not cfg.model.lora_rank,
            "dpo.ref_update_freq",
            cfg.dpo.ref_update_freq,
            "0 with LoRA (the reference is the base model, the adapter switched off; refreshing it is not implemented)",
        )
    if name == "distill":
        tc = cfg.teacher
        check(
            bool(tc.url) or bool(tc.model_path),
            "teacher.model_path",
            tc.model_path,
            "a teacher model directory when teacher.url is not given (distill needs a teacher)",
        )


def _check_dynamic_sampling(cfg: Config) -> None:
    """``algorithm.filter_groups`` and ``data.gen_batch_size``: what the batch schedules' dynamic sampling
    (``asyncrl.run.generation``) can honour. The keys are accepted while ``enable`` is false, as verl's
    DAPO scripts set them whether or not they turn it on."""
    fg, d, schedule = cfg.algorithm.filter_groups, cfg.data, cfg.trainer.schedule
    key = "algorithm.filter_groups.enable"
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
    check(
        cfg.algorithm.name != "distill",
        key,
        fg.enable,
        "false when algorithm.name=distill (it learns from the teacher; its rewards are only logged)",
    )
    skip = cfg.rollout.skip
    if skip.enable and skip.action == "repeat":
        raise ConfigError(
            "config keys algorithm.filter_groups.enable and rollout.skip.action: dynamic sampling cannot run with "
            "rollout.skip.action=repeat (replaying one dump for every generation batch would train its groups twice "
            "in one batch, and a dump without a group to keep would never fill one); use rollout.skip.action=cache "
            "or turn one of them off"
        )
    rm = cfg.reward_model
    if fg.metric in ("seq_reward", "seq_final_reward") and cfg.algorithm.name == "ppo" and rm.enable:
        check(
            False,
            "algorithm.filter_groups.metric",
            fg.metric,
            "acc or score when reward_model.enable is true (the reward model scores on the trainer, after groups "
            "are filtered, so a sequence's full reward is not known yet)",
        )


def _check_reward_shaping(cfg: Config) -> None:
    """The DAPO reward manager's overlong penalty: its buffer fits in the response, and the algorithm learns from
    rewards."""
    kw = cfg.reward_model.reward_kwargs
    ob, key = kw.overlong_buffer_cfg, "reward_model.reward_kwargs.overlong_buffer_cfg"
    if not ob.enable:
        return
    check(
        cfg.algorithm.name != "distill",
        f"{key}.enable",
        ob.enable,
        "false when algorithm.name=distill (it learns from the teacher; its rewards are only logged)",
    )
    max_resp_len = kw.max_resp_len_for(cfg.rollout.response_length)
    where = "reward_model.reward_kwargs.max_resp_len" if kw.max_resp_len else "rollout.response_length"
    check(ob.len <= max_resp_len, f"{key}.len", ob.len, f"<= the max_resp_len it ends at ({where}: {max_resp_len})")


def _check_sections_read(cfg: Config) -> None:
    """A section the chosen algorithm or schedule never reads is an error, not silently ignored. Of
    ``reward_model``, only the reward model's own keys are ppo's: its reward manager is every algorithm's."""
    name = cfg.algorithm.name
    rm = cfg.reward_model
    if (
        "reward_model" not in ALGORITHM_SECTIONS.get(name, ())
        and rm.reward_model_part != RewardModelConfig().reward_model_part
    ):
        raise ConfigError(
            f"config section reward_model: set, but algorithm.name={name} never reads it (only ppo does; of it, "
            "every algorithm reads reward_model.reward_manager and reward_model.reward_kwargs); remove it or "
            "choose that algorithm"
        )
    for section, default in SECTION_DEFAULTS.items():
        if section not in ALGORITHM_SECTIONS.get(name, ()) and getattr(cfg, section) != default():
            users = [a for a, secs in ALGORITHM_SECTIONS.items() if section in secs]
            raise ConfigError(
                f"config section {section}: set, but algorithm.name={name} never reads it (only "
                f"{' | '.join(users)} does); remove it or choose that algorithm"
            )
    if not (cfg.actor.use_kl_loss or name == "dpo") and cfg.ref != RefConfig():
        raise ConfigError(
            f"config section ref: set, but algorithm.name={name} with actor.use_kl_loss=false keeps no reference "
            "model (only a KL loss or dpo reads it); remove it or set actor.use_kl_loss=true"
        )
    if cfg.trainer.schedule != "fully_async" and cfg.async_training != AsyncTrainingConfig():
        raise ConfigError(
            f"config section async_training: set, but trainer.schedule={cfg.trainer.schedule} never reads it (only "
            "fully_async does); remove it or set trainer.schedule=fully_async"
        )
    if cfg.trainer.critic_warmup and name != "ppo":
        check(False, "trainer.critic_warmup", cfg.trainer.critic_warmup, f"0 when algorithm.name={name} (no critic)")
    est = cfg.algorithm.adv_estimator
    if est is not None and est not in ESTIMATORS.get(name, ()):
        if not ESTIMATORS.get(name):
            allowed = f"null when algorithm.name={name} (it fits no advantages)"
        else:
            allowed = f"{ESTIMATORS[name][0]} or null when algorithm.name={name}"
            if est == "gae":
                allowed += " (gae needs a critic: set algorithm.name=ppo)"
        check(False, "algorithm.adv_estimator", est, allowed)
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
