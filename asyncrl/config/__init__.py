"""One typed config tree for every algorithm and schedule (``schema``), loaded from YAML + dotted overrides
(``loading``) and checked at load (``checks``), so a bad key fails before any worker starts, naming the key."""

from asyncrl.config.checks import validate
from asyncrl.config.errors import ConfigError, check
from asyncrl.config.loading import load_config, load_schema, to_dict
from asyncrl.config.rollout import RewardConfig, RolloutConfig
from asyncrl.config.schema import (
    BACKENDS,
    SCHEDULES,
    Config,
    DataConfig,
    ModelConfig,
    PlacementConfig,
    PoolConfig,
    RayConfig,
    TrainerConfig,
    WeightSyncConfig,
)
from asyncrl.config.training import (
    ActorConfig,
    AlgorithmConfig,
    AsyncTrainingConfig,
    CriticConfig,
    CriticModelConfig,
    DistillConfig,
    DpoConfig,
    FilterGroupsConfig,
    OptimConfig,
    OverlongBufferConfig,
    RewardKwargsConfig,
    RewardModelConfig,
    RolloutCorrectionConfig,
    TeacherConfig,
)

__all__ = [
    "BACKENDS",
    "SCHEDULES",
    "DataConfig",
    "ModelConfig",
    "RolloutConfig",
    "OptimConfig",
    "ActorConfig",
    "RolloutCorrectionConfig",
    "AlgorithmConfig",
    "FilterGroupsConfig",
    "RewardConfig",
    "TrainerConfig",
    "WeightSyncConfig",
    "AsyncTrainingConfig",
    "TeacherConfig",
    "DistillConfig",
    "DpoConfig",
    "RayConfig",
    "CriticModelConfig",
    "CriticConfig",
    "RewardModelConfig",
    "RewardKwargsConfig",
    "OverlongBufferConfig",
    "PoolConfig",
    "PlacementConfig",
    "Config",
    "ConfigError",
    "check",
    "load_config",
    "load_schema",
    "to_dict",
    "validate",
]
