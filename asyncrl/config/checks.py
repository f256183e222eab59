"""Range and consistency checks that types alone cannot express, run once at load.

Besides ranges: a section the chosen algorithm or schedule never reads is an error naming it (a ``teacher:`` block
in a GRPO run would otherwise be silently ignored), and so is a key whose meaning depends on a choice not made.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.config.errors import ConfigError, check, choice
from asyncrl.config.model_checks import check_lora, check_quantization, check_trainer_ranks
from asyncrl.config.schema import (
    ALGORITHMS,
    BACKENDS,
    SCHEDULES,
    AsyncTrainingConfig,
    Config,
    CriticConfig,
    DistillConfig,
    DpoConfig,
    RewardModelConfig,
    TeacherConfig,
)


def validate(cfg: Config) -> None:
    """Range and consistency checks that types alone cannot express."""
    d, r, a, t = cfg.data, cfg.rollout, cfg.actor, cfg.trainer
    check(d.train_batch_size >= 1, "data.train_batch_size", d.train_batch_size, ">= 1")
    check(d.val_batch_size >= 1, "data.val_batch_size", d.val_batch_size, ">= 1")
    check(d.max_prompt_length >= 1, "data.max_prompt_length", d.max_prompt_length, ">= 1")
    choice("data.overlong_prompts", d.overlong_prompts, ("error", "filter"))
    check(bool(d.train_files), "data.train_files", d.train_files, "a non-empty list of parquet/jsonl files")
    choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    choice("rollout.engine", r.engine, ("builtin", "vllm"))
    check_lora(cfg)
    check_quantization(cfg)
    _check_multi_turn(cfg)
    check(r.max_num_seqs >= 1, "rollout.max_num_seqs", r.max_num_seqs, ">= 1")
    check(r.max_model_len is None or r.max_model_len >= 2, "rollout.max_model_len", r.max_model_len, ">= 2 or null")
    check(0 < r.gpu_memory_utilization < 1, "rollout.gpu_memory_utilization", r.gpu_memory_utilization, "in (0, 1)")
    check(r.n >= 1, "rollout.n", r.n, ">= 1")
    check(r.temperature >= 0, "rollout.temperature", r.temperature, ">= 0")
    check(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "in (0, 1]")
    check(r.top_k >= 0, "rollout.top_k", r.top_k, ">= 0 (0 = off)")
    check(r.response_length >= 1, "rollout.response_length", r.response_length, ">= 1")
    check(r.max_batch_size >= 1, "rollout.max_batch_size", r.max_batch_size, ">= 1")
    check(r.val_temperature >= 0, "rollout.val_temperature", r.val_temperature, ">= 0")
    check(r.generate_timeout_s > 0, "rollout.generate_timeout_s", r.generate_timeout_s, "> 0")
    check(t.max_worker_restarts >= 0, "trainer.max_worker_restarts", t.max_worker_restarts, ">= 0")
    check(t.call_timeout_s > 0, "trainer.call_timeout_s", t.call_timeout_s, "> 0")
    check(a.optim.lr > 0, "actor.optim.lr", a.optim.lr, "> 0")
    check(a.optim.weight_decay >= 0, "actor.optim.weight_decay", a.optim.weight_decay, ">= 0")
    check(
        len(a.optim.betas) == 2 and all(0 <= b < 1 for b in a.optim.betas),
        "actor.optim.betas",
        a.optim.betas,
        "two numbers in [0, 1)",
    )
    check(a.optim.lr_warmup_steps >= 0, "actor.optim.lr_warmup_steps", a.optim.lr_warmup_steps, ">= 0")
    check(a.ppo_mini_batch_size >= 1, "actor.ppo_mini_batch_size", a.ppo_mini_batch_size, ">= 1")
    check(
        a.ppo_mini_batch_size <= d.train_batch_size,
        "actor.ppo_mini_batch_size",
        a.ppo_mini_batch_size,
        f"<= data.train_batch_size ({d.train_batch_size})",
    )
    check(
        d.train_batch_size % a.ppo_mini_batch_size == 0,
        "actor.ppo_mini_batch_size",
        a.ppo_mini_batch_size,
        f"a divisor of data.train_batch_size ({d.train_batch_size})",
    )
    check(a.ppo_micro_batch_size >= 1, "actor.ppo_micro_batch_size", a.ppo_micro_batch_size, ">= 1")
    check(a.ppo_max_token_len_per_gpu >= 1, "actor.ppo_max_token_len_per_gpu", a.ppo_max_token_len_per_gpu, ">= 1")
    check(a.ppo_epochs >= 1, "actor.ppo_epochs", a.ppo_epochs, ">= 1")
    check(0 <= a.clip_ratio < 1, "actor.clip_ratio", a.clip_ratio, "in [0, 1)")
    for k in ("clip_ratio_low", "clip_ratio_high"):
        v = getattr(a, k)
        check(v is None or v >= 0, f"actor.{k}", v, ">= 0 or null")
    check(a.clip_ratio_c is None or a.clip_ratio_c > 1, "actor.clip_ratio_c", a.clip_ratio_c, "> 1 or null")
    choice("actor.loss_agg_mode", a.loss_agg_mode, ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"))
    choice("actor.kl_loss_type", a.kl_loss_type, ("k1", "k2", "k3", "low_var_kl", "kl", "mse"))
    check(a.kl_loss_coef >= 0, "actor.kl_loss_coef", a.kl_loss_coef, ">= 0")
    rc = cfg.algorithm.rollout_correction
    choice("algorithm.rollout_correction.rollout_is", rc.rollout_is, (None, "disabled", "token", "sequence"))
    check(
        rc.rollout_is_threshold >= 1,
        "algorithm.rollout_correction.rollout_is_threshold",
        rc.rollout_is_threshold,
        ">= 1",
    )
    choice("algorithm.name", cfg.algorithm.name, ALGORITHMS)
    choice("trainer.schedule", t.schedule, SCHEDULES)
    choice("trainer.backend", t.backend, BACKENDS)
    check(t.role_start_timeout_s > 0, "trainer.role_start_timeout_s", t.role_start_timeout_s, "> 0")
    check(t.total_training_steps >= 1, "trainer.total_training_steps", t.total_training_steps, ">= 1")
    check(t.max_checkpoints_to_keep >= 1, "trainer.max_checkpoints_to_keep", t.max_checkpoints_to_keep, ">= 1")
    check(
        t.resume_mode in ("auto", "disable") or Path(t.resume_mode).is_dir(),
        "trainer.resume_mode",
        t.resume_mode,
        "auto, disable, or an existing checkpoint directory",
    )
    for b in t.logger:
        choice("trainer.logger", b, ("console", "jsonl", "tensorboard", "prometheus"))
    check(t.cpus_per_worker >= 1, "trainer.cpus_per_worker", t.cpus_per_worker, ">= 1")
    check_trainer_ranks(cfg)
    check(r.num_workers >= 1, "rollout.num_workers", r.num_workers, ">= 1")
    check(r.cpus_per_worker > 0, "rollout.cpus_per_worker", r.cpus_per_worker, "> 0")
    s = cfg.sync
    check(s.bucket_mb > 0, "sync.bucket_mb", s.bucket_mb, "> 0")
    check(s.timeout_s > 0, "sync.timeout_s", s.timeout_s, "> 0")
    check(cfg.ray.num_cpus is None or cfg.ray.num_cpus >= 1, "ray.num_cpus", cfg.ray.num_cpus, ">= 1 or null")
    _validate_async_training(cfg)
    _validate_distill(cfg)
    _validate_dpo(cfg)
    _validate_reward(cfg)
    _validate_trace(cfg)
    _validate_ppo(cfg)
    _validate_sections_read(cfg)  # after the ranges: a bad value is named even in a section the run would not read


# What each algorithm needs besides the policy, and the sections only it reads.
ALGORITHM_SECTIONS = {
    "grpo": (),
    "ppo": ("critic", "reward_model"),
    "distill": ("teacher", "distill"),
    "dpo": ("dpo",),
}
SECTION_DEFAULTS = {
    "critic": CriticConfig,
    "reward_model": RewardModelConfig,
    "teacher": TeacherConfig,
    "distill": DistillConfig,
    "dpo": DpoConfig,
}
ESTIMATORS = {"grpo": ("grpo",), "ppo": ("gae",), "distill": (), "dpo": ()}


def _validate_sections_read(cfg: Config) -> None:
    """A section the chosen algorithm or schedule never reads is an error, not silently ignored."""
    name = cfg.algorithm.name
    for section, default in SECTION_DEFAULTS.items():
        if section not in ALGORITHM_SECTIONS[name] and getattr(cfg, section) != default():
            users = [a for a, secs in ALGORITHM_SECTIONS.items() if section in secs]
            raise ConfigError(
                f"config section {section}: set, but algorithm.name={name} never reads it (only "
                f"{' | '.join(users)} does); remove it or choose that algorithm"
            )
    if cfg.trainer.schedule != "fully_async" and cfg.async_training != AsyncTrainingConfig():
        raise ConfigError(
            f"config section async_training: set, but trainer.schedule={cfg.trainer.schedule} never reads it (only "
            "fully_async does); remove it or set trainer.schedule=fully_async"
        )
    if cfg.trainer.critic_warmup and name != "ppo":
        check(False, "trainer.critic_warmup", cfg.trainer.critic_warmup, f"0 when algorithm.name={name} (no critic)")
    est = cfg.algorithm.adv_estimator
    if est is not None and est not in ESTIMATORS[name]:
        if name in ("distill", "dpo"):
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


def _validate_trace(cfg: Config) -> None:
    t = cfg.rollout.trace
    check(t.max_samples_per_step >= 1, "rollout.trace.max_samples_per_step", t.max_samples_per_step, ">= 1")
    sk = cfg.rollout.skip
    choice("rollout.skip.action", sk.action, ("cache", "repeat"))
    check(
        not sk.enable or cfg.trainer.schedule != "fully_async",
        "rollout.skip.enable",
        sk.enable,
        "false with trainer.schedule=fully_async (its Rollouter streams groups, not per-step batches)",
    )


def _validate_reward(cfg: Config) -> None:
    rw = cfg.reward
    check(rw.max_concurrency >= 1, "reward.max_concurrency", rw.max_concurrency, ">= 1")
    check(rw.timeout_s > 0, "reward.timeout_s", rw.timeout_s, "> 0")
    check(rw.remote_max_retries >= 0, "reward.remote_max_retries", rw.remote_max_retries, ">= 0")
    check(rw.remote_backoff_s >= 0, "reward.remote_backoff_s", rw.remote_backoff_s, ">= 0")
    check(
        rw.remote_url is None or not rw.custom_function,
        "reward.remote_url",
        rw.remote_url,
        "null when reward.custom_function is set (one reward source)",
    )
    check(
        rw.remote_url is None or str(rw.remote_url).startswith(("http://", "https://")),
        "reward.remote_url",
        rw.remote_url,
        "an http(s):// URL",
    )
    g = rw.genrm
    for key, value in [("reward.remote_url", rw.remote_url), ("reward.custom_function", rw.custom_function)]:
        check(g.url is None or not value, "reward.genrm.url", g.url, f"null when {key} is set (one reward source)")
    check(
        g.url is None or str(g.url).startswith(("http://", "https://")), "reward.genrm.url", g.url, "an http(s):// URL"
    )
    check(g.top_logprobs >= 1, "reward.genrm.top_logprobs", g.top_logprobs, ">= 1")
    check(g.positive.strip() not in ("", g.negative.strip()), "reward.genrm.positive", g.positive, "not '' or negative")


def _validate_dpo(cfg: Config) -> None:
    d = cfg.dpo
    check(d.beta > 0, "dpo.beta", d.beta, "> 0")
    choice("dpo.loss_type", d.loss_type, ("sigmoid", "ipo"))
    check(d.ref_update_freq >= 0, "dpo.ref_update_freq", d.ref_update_freq, ">= 0 (0: the reference stays frozen)")
    if cfg.algorithm.name != "dpo":
        return
    check(cfg.rollout.n >= 2, "rollout.n", cfg.rollout.n, ">= 2 when algorithm.name=dpo (a pair needs two samples)")
    check(
        not cfg.actor.use_kl_loss,
        "actor.use_kl_loss",
        cfg.actor.use_kl_loss,
        "false when algorithm.name=dpo (DPO's loss already holds the policy to its reference, dpo.beta)",
    )
    check(
        d.ref_update_freq == 0 or not cfg.model.lora_rank,
        "dpo.ref_update_freq",
        d.ref_update_freq,
        "0 with LoRA (the reference is the base model, the adapter switched off; refreshing it is not implemented)",
    )


def _validate_distill(cfg: Config) -> None:
    tc, dc = cfg.teacher, cfg.distill
    check(tc.top_k >= 1, "teacher.top_k", tc.top_k, ">= 1")
    check(tc.max_in_flight >= 1, "teacher.max_in_flight", tc.max_in_flight, ">= 1")
    check(tc.timeout_s > 0, "teacher.timeout_s", tc.timeout_s, "> 0")
    check(tc.max_retries >= 0, "teacher.max_retries", tc.max_retries, ">= 0")
    check(tc.backoff_s >= 0, "teacher.backoff_s", tc.backoff_s, ">= 0")
    check(tc.server_max_batch >= 1, "teacher.server_max_batch", tc.server_max_batch, ">= 1")
    check(tc.server_threads >= 1, "teacher.server_threads", tc.server_threads, ">= 1")
    check(tc.startup_timeout_s > 0, "teacher.startup_timeout_s", tc.startup_timeout_s, "> 0")
    check(tc.max_restarts >= 0, "teacher.max_restarts", tc.max_restarts, ">= 0")
    choice("teacher.check_tokenizer", tc.check_tokenizer, ("auto", "fingerprint", "probe"))
    choice("distill.loss", dc.loss, ("forward_kl", "jsd", "reverse_kl"))
    check(0.0 <= dc.beta <= 1.0, "distill.beta", dc.beta, "in [0, 1]")
    check(0.0 <= dc.lmbda <= 1.0, "distill.lmbda", dc.lmbda, "in [0, 1]")
    choice("distill.tail", dc.tail, ("bucket", "renorm"))
    choice("distill.reverse_kl_estimator", dc.reverse_kl_estimator, ("k1", "k3"))
    if cfg.algorithm.name == "distill":
        check(
            bool(tc.url) or bool(tc.model_path),
            "teacher.model_path",
            tc.model_path,
            "a teacher model directory when teacher.url is not given (distill needs a teacher)",
        )


def _validate_ppo(cfg: Config) -> None:
    al, c, rm, t = cfg.algorithm, cfg.critic, cfg.reward_model, cfg.trainer
    check(0 <= al.gamma <= 1, "algorithm.gamma", al.gamma, "in [0, 1]")
    check(0 <= al.lam <= 1, "algorithm.lam", al.lam, "in [0, 1]")
    check(c.cliprange_value >= 0, "critic.cliprange_value", c.cliprange_value, ">= 0")
    check(c.optim.lr > 0, "critic.optim.lr", c.optim.lr, "> 0")
    check(c.ppo_epochs >= 1, "critic.ppo_epochs", c.ppo_epochs, ">= 1")
    check(c.ppo_micro_batch_size >= 1, "critic.ppo_micro_batch_size", c.ppo_micro_batch_size, ">= 1")
    check(c.ppo_max_token_len_per_gpu >= 1, "critic.ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu, ">= 1")
    choice("critic.loss_agg_mode", c.loss_agg_mode, ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"))
    check(t.critic_warmup >= 0, "trainer.critic_warmup", t.critic_warmup, ">= 0")
    check(not rm.enable or bool(rm.path), "reward_model.path", rm.path, "a model directory when reward_model.enable")
    check(rm.micro_batch_size >= 1, "reward_model.micro_batch_size", rm.micro_batch_size, ">= 1")


def _validate_async_training(cfg: Config) -> None:
    at, a = cfg.async_training, cfg.actor
    key = "async_training."
    check(at.staleness_threshold >= 0, key + "staleness_threshold", at.staleness_threshold, ">= 0")
    check(
        at.trigger_parameter_sync_step >= 1,
        key + "trigger_parameter_sync_step",
        at.trigger_parameter_sync_step,
        ">= 1",
    )
    check(at.require_batches >= 1, key + "require_batches", at.require_batches, ">= 1")
    choice(key + "drop_policy", at.drop_policy, ("backpressure", "oldest"))
    check(at.get_batch_timeout_s > 0, key + "get_batch_timeout_s", at.get_batch_timeout_s, "> 0")
    check(at.pause_timeout_s > 0, key + "pause_timeout_s", at.pause_timeout_s, "> 0")
    groups_per_step = at.require_batches * a.ppo_mini_batch_size
    check(
        at.max_queue_size is None or at.max_queue_size >= groups_per_step,
        key + "max_queue_size",
        at.max_queue_size,
        f">= require_batches * actor.ppo_mini_batch_size = {groups_per_step} groups (one trainer step), or null",
    )
    check(
        at.max_inflight_groups is None or at.max_inflight_groups >= 1,
        key + "max_inflight_groups",
        at.max_inflight_groups,
        ">= 1 or null",
    )
    if cfg.trainer.schedule == "fully_async":
        t = cfg.trainer
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
            cfg.rollout.num_workers == 1,
            "rollout.num_workers",
            cfg.rollout.num_workers,
            "1 in fully_async (one Rollouter; several are not implemented yet)",
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


def _check_multi_turn(cfg: Config) -> None:
    """(``rollout.agent.default_agent_loop`` is checked against the registered loops when a run starts, where the
    loops a user registered are known: ``asyncrl.rollout.agent.loop.check_agent_loop``.)"""
    mt = cfg.rollout.multi_turn
    t = mt.max_assistant_turns
    check(t is None or t >= 1, "rollout.multi_turn.max_assistant_turns", t, ">= 1 or null")
    choice(
        "rollout.multi_turn.tool_response_truncate_side", mt.tool_response_truncate_side, ("left", "middle", "right")
    )
    choice("rollout.multi_turn.format", mt.format, ("hermes",))
    check(mt.tool_timeout_s > 0, "rollout.multi_turn.tool_timeout_s", mt.tool_timeout_s, "> 0")
    if cfg.rollout.agent.default_agent_loop == "tool_agent":
        check(bool(mt.tools), "rollout.multi_turn.tools", mt.tools, "a non-empty list with the tool agent")
