"""What each role is given instead of the whole config: the sections it reads and the decisions others made for it
(docs/design.md, "Each role gets its own spec"). A worker never sees ``algorithm.name`` or ``trainer.schedule``;
``trainer.device`` is resolved where each role runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from asyncrl.config.rollout import RewardConfig, RolloutConfig
from asyncrl.config.schema import Config, DataConfig, ModelConfig
from asyncrl.config.training import (
    ActorConfig,
    AsyncTrainingConfig,
    CriticConfig,
    FilterGroupsConfig,
    OverlongBufferConfig,
    RefConfig,
    RewardModelConfig,
)

OLD_POLICIES = ("behaviour", "actor", "prox")


@dataclass(frozen=True)
class TrainerNeeds:
    """What an algorithm needs of the trainer beyond its objective (``Algorithm.trainer_needs``)."""

    reference: bool = False  # keep a frozen reference policy (a KL loss, online DPO)
    ref_refresh_every: int = 0  # copy the actor into the reference every N updates (0: frozen for the run)


@dataclass(frozen=True)
class TrainerPlan:
    """What a schedule decides for the trainer."""

    old_policy: str = "actor"  # the PPO ratio's denominator: behaviour log-probs | current weights | window start
    updates_per_version: int = 1  # updates per weight version (fully_async: trigger_parameter_sync_step)
    engine_is_rollout: bool = False  # the trainer's engine generates the batches (sync), not only evaluates

    def __post_init__(self) -> None:
        if self.old_policy not in OLD_POLICIES:
            raise ValueError(f"TrainerPlan.old_policy: one of {', '.join(OLD_POLICIES)} (got {self.old_policy!r})")


def default_old_policy(cfg: Config) -> str:
    """The PPO ratio's denominator a schedule uses unless it decides otherwise: the behaviour log-probs
    (``actor.use_rollout_log_probs``, bypass mode) or the trainer's current weights."""
    return "behaviour" if cfg.actor.use_rollout_log_probs else "actor"


@dataclass(frozen=True)
class EngineSpec:
    """What builds a rollout engine over ``model``: the engine's knobs and what sizes its context."""

    model: ModelConfig
    rollout: RolloutConfig
    max_prompt_length: int
    seed: int
    device: str = "auto"  # trainer.device: resolved where the engine runs (asyncrl.models.device)


@dataclass
class RewardSpec(RewardConfig):
    """What a role that scores rule rewards is given: the ``reward`` section, and the reward manager's shaping
    resolved from ``reward_model.reward_manager`` / ``reward_kwargs`` (verl's keys; the role never sees
    ``reward_model``, whose reward model is ppo's). Read by ``asyncrl.rewards.overlong.OverlongShaping.of``."""

    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # enabled: the DAPO manager's
    max_resp_len: int = 0  # tokens the overlong buffer ends at (reward_kwargs.max_resp_len or rollout.response_length)

    @classmethod
    def of(cls, cfg: Config) -> RewardSpec:
        rm = cfg.reward_model
        kw = rm.reward_kwargs
        shaping = kw.overlong_buffer_cfg if rm.reward_manager == "dapo" else OverlongBufferConfig()
        section = {f.name: getattr(cfg.reward, f.name) for f in fields(RewardConfig)}
        return cls(**section, overlong_buffer=shaping, max_resp_len=kw.max_resp_len_for(cfg.rollout.response_length))


@dataclass(frozen=True)
class RolloutSpec:
    """A rollout worker: its engine, and the rule reward it scores each sample with where it was made."""

    engine: EngineSpec
    reward: RewardConfig  # a RewardSpec when built by role_specs


@dataclass(frozen=True)
class RollouterSpec(RolloutSpec):
    """The fully_async producer: a rollout worker that also draws the prompts and keeps the stream's books."""

    data: DataConfig = field(default_factory=DataConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    ppo_mini_batch_size: int = 1  # groups per optimizer step: the unit of the staleness budget
    # dynamic sampling: which finished groups are queued (asyncrl.rewards.filtering.keep_group with its metric)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass(frozen=True)
class TrainerSpec(RolloutSpec):
    """The trainer (actor) role: its model, optimiser and micro-batching, the engine it evaluates (or, in sync,
    generates) with, and what the algorithm and the schedule decided for it."""

    actor: ActorConfig
    strategy: str  # ddp | fsdp2, with several ranks
    record_consumed: bool  # fingerprint the weights after every update (asyncrl replay)
    default_mini_batches: int  # optimizer steps per update when the caller does not say
    needs: TrainerNeeds
    plan: TrainerPlan
    ref: RefConfig = field(default_factory=RefConfig)  # the reference model's offload and log-prob budget

    @property
    def model(self) -> ModelConfig:
        return self.engine.model


@dataclass(frozen=True)
class CriticSpec:
    critic: CriticConfig
    model: ModelConfig  # the policy's: the critic's body starts from it unless critic.model.path is set
    seed: int
    device: str = "auto"


@dataclass(frozen=True)
class RewardModelSpec:
    reward_model: RewardModelConfig
    policy_path: str  # its tokenizer must be the policy's
    device: str = "auto"


@dataclass(frozen=True)
class RoleSpecs:
    """Every role's spec for one run."""

    trainer: TrainerSpec
    rollout: RolloutSpec
    rollouter: RollouterSpec
    critic: CriticSpec
    reward_model: RewardModelSpec


def role_specs(cfg: Config, needs: TrainerNeeds, plan: TrainerPlan) -> RoleSpecs:
    t = cfg.trainer
    engine = EngineSpec(cfg.model, cfg.rollout, cfg.data.max_prompt_length, t.seed, t.device)
    reward = RewardSpec.of(cfg)
    return RoleSpecs(
        trainer=TrainerSpec(
            engine=engine,
            reward=reward,
            actor=cfg.actor,
            strategy=t.strategy,
            record_consumed=t.record_consumed,
            default_mini_batches=max(1, cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size),
            needs=needs,
            plan=plan,
            ref=cfg.ref,
        ),
        rollout=RolloutSpec(engine, reward),
        rollouter=RollouterSpec(
            engine, reward, cfg.data, cfg.async_training, cfg.actor.ppo_mini_batch_size, cfg.algorithm.filter_groups
        ),
        critic=CriticSpec(cfg.critic, cfg.model, t.seed, t.device),
        reward_model=RewardModelSpec(cfg.reward_model, cfg.model.path, t.device),
    )
