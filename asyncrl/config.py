"""One typed config tree for every mode.

Leaf names follow verl's where the concept is the same (``data.train_batch_size``, ``rollout.n``,
``actor.ppo_mini_batch_size``, ...) without verl's ``actor_rollout_ref.`` nesting. Every knob is read from here; a YAML
file and dotted command-line overrides are merged onto the dataclass defaults with OmegaConf, so an unknown key or a
wrong type fails at load, naming the key, before any worker starts. Range checks live in ``validate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config problem, always naming the key (``rollout.n``), the value and what is allowed."""


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)  # parquet/jsonl in verl's schema
    val_files: list[str] = field(default_factory=list)
    train_batch_size: int = 16  # prompts per training step (each gets rollout.n responses)
    val_batch_size: int = 512  # prompts per eval generation call
    val_max_samples: int = -1  # evaluate on at most this many held-out prompts (-1 = all)
    max_prompt_length: int = 256  # tokens
    overlong_prompts: str = "error"  # error | filter
    shuffle: bool = True


@dataclass
class ModelConfig:
    path: str = MISSING  # a local Hugging Face causal-LM directory
    dtype: str = "float32"


@dataclass
class RolloutConfig:
    engine: str = "builtin"  # builtin (our decode loop)
    n: int = 8  # responses per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    response_length: int = 32  # max new tokens per response
    max_batch_size: int = 256  # sequences decoded at once
    val_temperature: float = 0.0  # 0 = greedy held-out evaluation
    num_workers: int = 1  # rollout workers in the rollout pool (modes with a separate rollout pool)
    cpus_per_worker: float = 1.0  # CPUs per rollout worker; its torch threads = this, rounded down


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_warmup_steps: int = 0  # linear warm-up, in optimizer steps
    grad_clip: float = 1.0  # max global grad norm (<= 0 disables)


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 16  # prompts per optimizer step (x rollout.n samples), as in verl
    ppo_micro_batch_size: int = 64  # samples per forward/backward (gradient accumulation); memory only
    ppo_epochs: int = 1
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None  # defaults to clip_ratio
    clip_ratio_high: float | None = None  # defaults to clip_ratio
    clip_ratio_c: float | None = None  # dual-clip bound for negative advantages (off when null)
    entropy_coeff: float = 0.0
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"  # k1 | k2 | k3 | low_var_kl | kl | mse
    use_rollout_log_probs: bool = False  # true: the rollout's behaviour log-probs are the PPO old policy
    skip_zero_adv_rows: bool = True  # rows with all-zero advantages skip forward/backward (same gradient, less work)


@dataclass
class RolloutCorrectionConfig:
    rollout_is: str | None = None  # null | token | sequence
    rollout_is_threshold: float = 2.0


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo | gae (PPO with a critic: trainer.mode=ppo)
    norm_adv_by_std_in_grpo: bool = True
    gamma: float = 1.0  # gae: discount per response token
    lam: float = 1.0  # gae: lambda (bias/variance trade-off of the advantage estimate)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class RewardConfig:
    custom_function: str | None = None  # "path/to/file.py:fn" with verl's signature; null = built-in registry
    binarize: bool = False  # reward 1.0 only for a full score (reasoning-gym scorers give partial credit), else 0.0


@dataclass
class TrainerConfig:
    mode: str = "sync"  # sync | one_step_off | fully_async | ppo | distill
    scheduler: str = "one_step_off"  # distill only: serial | one_step_off | two_step_off
    total_training_steps: int = 10
    default_local_dir: str = "runs/default"
    save_freq: int = 5  # steps between checkpoints (<= 0: only the final one)
    test_freq: int = 5  # steps between held-out evaluations (<= 0: only before and after)
    val_before_train: bool = True
    resume_mode: str = "auto"  # auto | disable | a checkpoint directory
    max_checkpoints_to_keep: int = 2
    seed: int = 1
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    prometheus_port: int | None = None
    cpus_per_worker: float = 2.0  # CPUs of the (colocated) trainer worker; torch threads = this, rounded down
    num_workers: int = 1  # trainer workers (data parallel); only 1 is implemented
    critic_warmup: int = 0  # ppo: steps that update only the critic before the actor starts learning


@dataclass
class SyncConfig:
    bucket_mb: float = 64.0  # MiB per flat broadcast bucket
    verify: bool = False  # CRC32 per bucket, checked by every rollout worker
    timeout_s: float = 60.0  # a weight sync that takes longer raises, naming the step and the worker


@dataclass
class AsyncTrainingConfig:
    """``fully_async`` only (verl's ``async_training`` section); see asyncrl/streaming/staleness.py for the bound."""

    staleness_threshold: float = 0.0  # extra groups in flight, as a fraction of one sync window
    trigger_parameter_sync_step: int = 1  # trainer steps per weight sync (= per version)
    require_batches: int = 1  # ppo_mini_batch_size groups per trainer step (one optimizer step each)
    drop_policy: str = "backpressure"  # queue full: backpressure (the rollouter waits) | oldest (drop, counted)
    max_queue_size: int | None = None  # groups; null = the staleness budget (never fills while synced)
    partial_rollout: bool = True  # at a sync, interrupt in-flight generations and resume them with the new weights
    compute_prox_log_prob: bool = False  # decoupled PPO: old = the weights at the start of the sync window
    max_inflight_groups: int | None = None  # groups generated at once; null = rollout.max_batch_size // rollout.n


@dataclass
class TeacherConfig:
    """``distill`` only: the teacher server (vLLM's /v1/completions with prompt_logprobs)."""

    # a running server (ours, or `vllm serve`); null = start `asyncrl serve-teacher` on teacher.model_path
    url: str | None = None
    model_path: str | None = None  # the teacher's HF directory, for the server started here
    top_k: int = 16  # teacher log-probs per position
    max_in_flight: int = 16  # concurrent requests (one sequence each; the server batches them)
    timeout_s: float = 60.0  # per connect / per wait for reply bytes
    max_retries: int = 3  # retries of a failed request (connection errors, 5xx, 408, 429), with back-off
    backoff_s: float = 0.5  # first retry delay; doubles each retry
    server_max_batch: int = 64  # sequences per teacher forward pass (the server started here)
    server_threads: int = 1  # torch threads of the server started here
    startup_timeout_s: float = 120.0  # how long to wait for the started server to answer /health
    check_tokenizer: str = "auto"  # auto | fingerprint | probe: how the shared vocabulary is checked at start


@dataclass
class DistillConfig:
    """``distill`` only: the loss between teacher p and student q on the student's responses (GKD)."""

    loss: str = "forward_kl"  # forward_kl (top-k KL(p||q)) | jsd (generalised JSD with beta) | reverse_kl (sampled)
    beta: float = 0.5  # jsd: weight of the teacher side (0 = forward KL, 1 = reverse KL)
    lmbda: float = 1.0  # fraction of steps trained on student-generated responses; the rest on the dataset's answers
    tail: str = "bucket"  # top-k losses: the teacher mass outside its top k as one bucket, or renorm over the top k
    reverse_kl_estimator: str = "k3"  # reverse_kl: k1 | k3 (score-function gradient either way)


@dataclass
class RayConfig:
    address: str | None = None  # connect to an existing cluster; null = start a local one on 127.0.0.1
    num_cpus: int | None = None  # CPUs of the local cluster (null = all of this machine's)


# ---- PPO with a critic, a reward model and role placement (trainer.mode=ppo) -------------------------------------
@dataclass
class CriticModelConfig:
    path: str | None = None  # a causal-LM directory for the critic's body; null = the policy's model.path


@dataclass
class CriticConfig:
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    cliprange_value: float = 0.5  # reward units: a value prediction may move at most this far from its old one
    ppo_epochs: int = 1
    ppo_micro_batch_size: int = 64  # samples per forward/backward; memory only
    loss_agg_mode: str = "token-mean"


@dataclass
class RewardModelConfig:
    enable: bool = False
    path: str | None = None  # a sequence-classification directory (e.g. from `asyncrl train-rm`)
    weight: float = 1.0  # reward = rule_weight * rule reward + weight * sigmoid(reward-model logit)
    rule_weight: float = 1.0
    micro_batch_size: int = 64


@dataclass
class PoolConfig:
    cpus: float = 1.0  # CPUs reserved for the pool; every role on it gets this many torch threads


@dataclass
class PlacementConfig:
    """Roles -> named pools. Empty = PPO's split default (see asyncrl/workers/placement.py)."""

    pools: dict[str, PoolConfig] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # actor | rollout | ref | critic | reward_model -> pool


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    schema: type = Config,
    validate_fn: Any = None,
) -> Any:
    """Merge a YAML file and ``key=value`` overrides onto the dataclass defaults and validate.

    Raises ``ConfigError`` naming the key for an unknown key, a wrong type, a missing value or an out-of-range value.
    """
    base = OmegaConf.structured(schema)
    layers = []
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p}: no such file")
        try:
            layers.append((str(p), OmegaConf.load(p)))
        except Exception as e:  # yaml syntax errors
            raise ConfigError(f"config file {p}: not valid YAML: {e}") from None
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"command-line override {item!r}: expected key=value (e.g. rollout.n=8)")
        layers.append((f"override {item!r}", OmegaConf.from_dotlist([item])))
    merged = base
    for where, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise ConfigError(_describe(e, where)) from None
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(_describe(e, "config")) from None
    (validate_fn or validate)(cfg)
    return cfg


def _describe(e: OmegaConfBaseException, where: str) -> str:
    key = getattr(e, "full_key", None) or "?"
    msg = str(e).splitlines()[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        return f"{where}: unknown config key {key!r}"
    if "missing mandatory value" in msg.lower():
        return f"config key {key} is required (got no value)"
    return f"{where}: config key {key}: {msg}"


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key} must be {allowed} (got {value!r})")


def _choice(key: str, value: Any, choices: tuple) -> None:
    check(value in choices, key, value, "one of " + ", ".join(str(c) for c in choices))


def validate(cfg: Config) -> None:
    """Range and consistency checks that types alone cannot express."""
    d, r, a, t = cfg.data, cfg.rollout, cfg.actor, cfg.trainer
    check(d.train_batch_size >= 1, "data.train_batch_size", d.train_batch_size, ">= 1")
    check(d.val_batch_size >= 1, "data.val_batch_size", d.val_batch_size, ">= 1")
    check(d.max_prompt_length >= 1, "data.max_prompt_length", d.max_prompt_length, ">= 1")
    _choice("data.overlong_prompts", d.overlong_prompts, ("error", "filter"))
    check(bool(d.train_files), "data.train_files", d.train_files, "a non-empty list of parquet/jsonl files")
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    _choice("rollout.engine", r.engine, ("builtin",))
    check(r.n >= 1, "rollout.n", r.n, ">= 1")
    check(r.temperature >= 0, "rollout.temperature", r.temperature, ">= 0")
    check(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "in (0, 1]")
    check(r.top_k >= 0, "rollout.top_k", r.top_k, ">= 0 (0 = off)")
    check(r.response_length >= 1, "rollout.response_length", r.response_length, ">= 1")
    check(r.max_batch_size >= 1, "rollout.max_batch_size", r.max_batch_size, ">= 1")
    check(r.val_temperature >= 0, "rollout.val_temperature", r.val_temperature, ">= 0")
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
    check(a.ppo_epochs >= 1, "actor.ppo_epochs", a.ppo_epochs, ">= 1")
    check(0 <= a.clip_ratio < 1, "actor.clip_ratio", a.clip_ratio, "in [0, 1)")
    for k in ("clip_ratio_low", "clip_ratio_high"):
        v = getattr(a, k)
        check(v is None or v >= 0, f"actor.{k}", v, ">= 0 or null")
    check(a.clip_ratio_c is None or a.clip_ratio_c > 1, "actor.clip_ratio_c", a.clip_ratio_c, "> 1 or null")
    _choice("actor.loss_agg_mode", a.loss_agg_mode, ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"))
    _choice("actor.kl_loss_type", a.kl_loss_type, ("k1", "k2", "k3", "low_var_kl", "kl", "mse"))
    check(a.kl_loss_coef >= 0, "actor.kl_loss_coef", a.kl_loss_coef, ">= 0")
    _choice("algorithm.adv_estimator", cfg.algorithm.adv_estimator, ("grpo", "gae"))
    rc = cfg.algorithm.rollout_correction
    _choice("algorithm.rollout_correction.rollout_is", rc.rollout_is, (None, "token", "sequence"))
    check(
        rc.rollout_is_threshold >= 1,
        "algorithm.rollout_correction.rollout_is_threshold",
        rc.rollout_is_threshold,
        ">= 1",
    )
    _choice("trainer.mode", t.mode, ("sync", "one_step_off", "fully_async", "ppo", "distill"))
    _choice("trainer.scheduler", t.scheduler, ("serial", "one_step_off", "two_step_off"))
    check(t.total_training_steps >= 1, "trainer.total_training_steps", t.total_training_steps, ">= 1")
    check(t.max_checkpoints_to_keep >= 1, "trainer.max_checkpoints_to_keep", t.max_checkpoints_to_keep, ">= 1")
    check(
        t.resume_mode in ("auto", "disable") or Path(t.resume_mode).is_dir(),
        "trainer.resume_mode",
        t.resume_mode,
        "auto, disable, or an existing checkpoint directory",
    )
    for b in t.logger:
        _choice("trainer.logger", b, ("console", "jsonl", "tensorboard", "prometheus"))
    check(t.cpus_per_worker >= 1, "trainer.cpus_per_worker", t.cpus_per_worker, ">= 1")
    check(
        t.num_workers == 1, "trainer.num_workers", t.num_workers, "1 (data-parallel trainers are not implemented yet)"
    )
    check(r.num_workers >= 1, "rollout.num_workers", r.num_workers, ">= 1")
    check(r.cpus_per_worker > 0, "rollout.cpus_per_worker", r.cpus_per_worker, "> 0")
    s = cfg.sync
    check(s.bucket_mb > 0, "sync.bucket_mb", s.bucket_mb, "> 0")
    check(s.timeout_s > 0, "sync.timeout_s", s.timeout_s, "> 0")
    check(cfg.ray.num_cpus is None or cfg.ray.num_cpus >= 1, "ray.num_cpus", cfg.ray.num_cpus, ">= 1 or null")
    _validate_async_training(cfg)
    _validate_distill(cfg)
    _validate_ppo(cfg)


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
    _choice("teacher.check_tokenizer", tc.check_tokenizer, ("auto", "fingerprint", "probe"))
    _choice("distill.loss", dc.loss, ("forward_kl", "jsd", "reverse_kl"))
    check(0.0 <= dc.beta <= 1.0, "distill.beta", dc.beta, "in [0, 1]")
    check(0.0 <= dc.lmbda <= 1.0, "distill.lmbda", dc.lmbda, "in [0, 1]")
    _choice("distill.tail", dc.tail, ("bucket", "renorm"))
    _choice("distill.reverse_kl_estimator", dc.reverse_kl_estimator, ("k1", "k3"))
    if cfg.trainer.mode == "distill":
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
    _choice("critic.loss_agg_mode", c.loss_agg_mode, ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"))
    check(t.critic_warmup >= 0, "trainer.critic_warmup", t.critic_warmup, ">= 0")
    check(not rm.enable or bool(rm.path), "reward_model.path", rm.path, "a model directory when reward_model.enable")
    check(rm.micro_batch_size >= 1, "reward_model.micro_batch_size", rm.micro_batch_size, ">= 1")
    if t.mode == "ppo":
        check(al.adv_estimator == "gae", "algorithm.adv_estimator", al.adv_estimator, "gae when trainer.mode=ppo")
    elif al.adv_estimator == "gae":
        check(False, "algorithm.adv_estimator", al.adv_estimator, "grpo unless trainer.mode=ppo (gae needs a critic)")


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
    _choice(key + "drop_policy", at.drop_policy, ("backpressure", "oldest"))
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
    if cfg.trainer.mode == "fully_async":
        t = cfg.trainer
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
            not at.compute_prox_log_prob or cfg.algorithm.rollout_correction.rollout_is is not None,
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
