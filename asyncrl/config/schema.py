"""The config tree: one typed dataclass per section, one default per knob, each section checking its own fields.

Its two choices (``algorithm.name``, ``trainer.schedule``) and verl's names: docs/config.md. The rollout side's sections
live in ``asyncrl.config.rollout``, the learning side's in ``asyncrl.config.training``; this module holds the run's
own sections and the tree.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config.errors import ConfigError, check
from asyncrl.config.rollout import DTYPES, RewardConfig, RolloutConfig
from asyncrl.config.rules import NON_NEGATIVE, POSITIVE, POSITIVE_INT, Checked, at_least, one_of, or_null, rule
from asyncrl.config.training import (
    ActorConfig,
    AlgorithmConfig,
    AsyncTrainingConfig,
    CriticConfig,
    DistillConfig,
    DpoConfig,
    RefConfig,
    RewardModelConfig,
    TeacherConfig,
)

MISSING = "???"  # OmegaConf's marker of a required value (the tree imports without omegaconf: a GPU box may lack it)
SCHEDULES = ("sync", "one_step_off", "two_step_off", "fully_async")
BACKENDS = ("ray", "in_process")
LOGGERS = ("console", "jsonl", "tensorboard", "prometheus", "wandb", "mlflow")
# the loggers that need a package asyncrl does not install by itself: logger -> (module, what to install)
TRACKER_PACKAGES = {
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow (or the smaller mlflow-skinny)"),
}
STRATEGIES = ("ddp", "fsdp2")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class DataConfig(Checked):
    train_files: list[str] = field(default_factory=list)  # parquet/jsonl in verl's schema
    val_files: list[str] = field(default_factory=list)  # held-out rows for val/accuracy (empty: no evaluation)
    train_batch_size: int = 16  # prompts per training step (each gets rollout.n responses)
    # prompts per generation call with algorithm.filter_groups (verl's DAPO key); null = train_batch_size
    gen_batch_size: int | None = None
    val_batch_size: int = 512  # prompts per eval generation call
    val_max_samples: int = -1  # evaluate on at most this many held-out prompts (-1 = all)
    max_prompt_length: int = 256  # tokens
    # a prompt over max_prompt_length: error (naming its row) | filter (dropped, counted) | truncate_left (its last
    # max_prompt_length tokens kept: verl's data.truncation=left) | truncate_right (its first ones)
    overlong_prompts: str = "error"
    shuffle: bool = True  # a new order of the training rows every epoch (seeded by trainer.seed)

    RULES = {
        "train_files": rule(bool, "a non-empty list of parquet/jsonl files"),
        "train_batch_size": POSITIVE_INT,
        "gen_batch_size": or_null(POSITIVE_INT),
        "val_batch_size": POSITIVE_INT,
        "max_prompt_length": POSITIVE_INT,
        "overlong_prompts": one_of(("error", "filter", "truncate_left", "truncate_right")),
    }

    @property
    def prompts_per_generation(self) -> int:
        """Prompts one generation call draws: ``gen_batch_size``, else ``train_batch_size``."""
        return self.gen_batch_size or self.train_batch_size


def _module_names(t: object) -> bool:
    return t == "all-linear" or (isinstance(t, list) and bool(t) and all(isinstance(x, str) and x for x in t))


@dataclass
class ModelConfig(Checked):
    path: str = MISSING  # a local Hugging Face causal-LM directory
    dtype: str = "float32"  # float32 | bfloat16 | float16: the trainer's and engines' weights
    lora_rank: int = 0  # > 0: the actor trains a LoRA adapter of this rank (peft); only it trains and syncs
    lora_alpha: float = 16.0  # LoRA scaling numerator (the adapter's output is scaled by alpha / rank)
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names (q_proj, v_proj, ...)
    lora_adapter_path: str | None = None  # start from this peft adapter directory (its rank must be lora_rank)
    # config changes for the policy in trainer AND rollout: attn_implementation, rope_scaling, any config attribute
    override_config: dict[str, Any] = field(default_factory=dict)

    RULES = {
        "dtype": one_of(DTYPES),
        "lora_rank": at_least(0, " (0 = full fine-tuning)"),
        "lora_alpha": POSITIVE,
        "target_modules": rule(_module_names, '"all-linear" or a non-empty list of module names'),
    }

    def check(self, key: str) -> None:
        super().check(key)
        if self.lora_adapter_path is not None and not self.lora_rank:
            raise ConfigError(
                "model.lora_adapter_path is set but model.lora_rank is 0 (LoRA off): set the adapter's rank"
            )


@dataclass
class TrainerConfig(Checked):
    schedule: str = "sync"  # sync | one_step_off | two_step_off | fully_async (asyncrl/schedules/)
    backend: str = "ray"  # ray (roles are Ray actors) | in_process (the same workers in this process, no Ray)
    total_training_steps: int = 10  # trainer steps (optimizer updates per step: ppo_epochs x mini-batches)
    default_local_dir: str = "runs/default"  # the run directory: metrics, checkpoints, final model
    save_freq: int = 5  # steps between checkpoints (<= 0: only the final one)
    test_freq: int = 5  # steps between held-out evaluations (<= 0: only before and after)
    val_before_train: bool = True  # evaluate before the first step (logged as step 0)
    resume_mode: str = "auto"  # auto | disable | a checkpoint directory
    max_checkpoints_to_keep: int = 2  # older checkpoints are deleted
    seed: int = 1  # data order, initialisation and every generation seed derive from it
    # any of console, jsonl, tensorboard, prometheus, wandb, mlflow (the last two need their package installed)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    prometheus_port: int | None = None  # /metrics port with logger prometheus (null or 0: a free port)
    project_name: str = "asyncrl"  # with logger wandb / mlflow: the W&B project, the MLflow experiment (verl's key)
    experiment_name: str | None = None  # the W&B / MLflow run's name (verl's key); null = the run directory's name
    cpus_per_worker: float = 2.0  # CPUs of each trainer worker (rank); torch threads = this, rounded down
    num_workers: int = 1  # data-parallel ranks, each a share of the batch (left at 1: nnodes x n_gpus_per_node)
    nnodes: int = 1  # nodes the trainer's ranks spread over, num_workers / nnodes on each (verl's trainer.nnodes)
    n_gpus_per_node: int = 0  # GPUs per trainer node, one per rank (verl's trainer.n_gpus_per_node); 0: CPU ranks
    device: str = "auto"  # every role's torch device: auto (the role's GPU when it has one, else cpu) | cpu | cuda
    # GB of each GPU the roles run on, for the memory plan checked before any worker starts; null = the driver's GPU
    # (a driver without one skips the check, saying so)
    gpu_memory_gb: float | None = None
    strategy: str = "ddp"  # with num_workers > 1: ddp (weights replicated) | fsdp2 (sharded; trainer.backend=ray)
    critic_warmup: int = 0  # ppo: steps that update only the critic before the actor starts learning
    record_consumed: bool = False  # each step's consumed samples in RUN_DIR/consumed/ (asyncrl replay RUN_DIR)
    role_start_timeout_s: float = 600.0  # how long a role may take to start (load its model) before the run fails
    call_timeout_s: float = 7200.0  # a call to a worker (update, log-probs, checkpoint...) past this: hung, an error
    max_worker_restarts: int = 3  # rollout workers / the Rollouter replaced after dying or hanging (Ray); then stop

    RULES = {
        "schedule": one_of(SCHEDULES),
        "backend": one_of(BACKENDS),
        "total_training_steps": POSITIVE_INT,
        "max_checkpoints_to_keep": POSITIVE_INT,
        "project_name": rule(bool, "a non-empty name"),
        "experiment_name": or_null(rule(bool, "a non-empty name")),
        "resume_mode": rule(
            lambda v: v in ("auto", "disable") or Path(v).is_dir(), "auto, disable, or an existing checkpoint directory"
        ),
        "cpus_per_worker": at_least(1),
        "num_workers": POSITIVE_INT,
        "nnodes": POSITIVE_INT,
        "n_gpus_per_node": NON_NEGATIVE,
        "device": one_of(DEVICES),
        "gpu_memory_gb": or_null(POSITIVE),
        "strategy": one_of(STRATEGIES),
        "critic_warmup": NON_NEGATIVE,
        "role_start_timeout_s": POSITIVE,
        "call_timeout_s": POSITIVE,
        "max_worker_restarts": NON_NEGATIVE,
    }

    def check(self, key: str) -> None:
        super().check(key)
        for b in self.logger:
            check(b in LOGGERS, f"{key}.logger", b, "one of " + ", ".join(LOGGERS))
            if b not in TRACKER_PACKAGES:
                continue
            # a run that lists wandb without it fails here, before any worker starts, not at its first step
            module, install = TRACKER_PACKAGES[b]
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec (or set to None)
                found = False
            if not found:
                raise ConfigError(
                    f"config key {key}.logger lists {b}, but the {module} package is not installed: "
                    f"{install}, or pip install 'asyncrl[{b}]'"
                )


@dataclass
class WeightSyncConfig(Checked):
    bucket_mb: float = 64.0  # MiB per flat broadcast bucket
    verify: bool = False  # CRC32 per bucket, checked by every rollout worker
    timeout_s: float = 60.0  # a weight sync that takes longer raises, naming the step and the worker

    RULES = {"bucket_mb": POSITIVE, "timeout_s": POSITIVE}


@dataclass
class RayConfig(Checked):
    # null: start a private local cluster on 127.0.0.1 (even when another one runs on this machine); auto: join the
    # cluster running on this machine (`ray start --head`); host:port: join that cluster
    address: str | None = None
    num_cpus: int | None = None  # CPUs of the private local cluster (null = all of this machine's)
    num_gpus: int | None = None  # GPUs of the private local cluster (null = what Ray detects)
    placement_timeout_s: float = 60.0  # a plan the cluster cannot hold fails after this, naming what is missing

    RULES = {"num_cpus": or_null(POSITIVE_INT), "num_gpus": or_null(NON_NEGATIVE), "placement_timeout_s": POSITIVE}


# ---- role placement (every algorithm and schedule) ---------------------------------------------------------------
@dataclass
class PoolConfig:
    cpus: float = 1.0  # CPUs reserved for the pool; every role on it gets this many torch threads
    gpus: float = 0.0  # GPUs reserved for the pool (on one node); roles on it share them


@dataclass
class PlacementConfig:
    """Training roles -> named pools. Empty = every role on the trainer's pool (checked against the algorithm's
    roles and the cluster when a run starts: asyncrl/roles/placement.py)."""

    pools: dict[str, PoolConfig] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # actor | critic | reward_model -> pool


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    dpo: DpoConfig = field(default_factory=DpoConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    def check_sections(self) -> None:
        """Every section checks its own fields, under its own key (``rollout.n``, ``actor.optim.lr``)."""
        for name in self.__dataclass_fields__:
            section = getattr(self, name)
            if isinstance(section, Checked):
                section.check(name)


# the sections only some algorithm reads (it declares them: ``Algorithm.sections``), at their defaults: set in a run of
# another algorithm, each is an error naming it (``reward_model`` is checked apart: its reward manager is everyone's)
SECTION_DEFAULTS = {"critic": CriticConfig, "teacher": TeacherConfig, "distill": DistillConfig, "dpo": DpoConfig}
