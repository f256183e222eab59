"""One typed config tree for every algorithm and schedule (``schema``), loaded from YAML + dotted overrides
(``loading``) and checked at load (``checks``), so a bad key fails before any worker starts, naming the key."""

from asyncrl.config.checks import validate as validate
from asyncrl.config.errors import ConfigError as ConfigError
from asyncrl.config.errors import check as check
from asyncrl.config.loading import load_config as load_config
from asyncrl.config.loading import load_schema as load_schema
from asyncrl.config.loading import to_dict as to_dict
from asyncrl.config.rollout import RewardConfig as RewardConfig
from asyncrl.config.rollout import RolloutConfig as RolloutConfig
from asyncrl.config.schema import BACKENDS as BACKENDS
from asyncrl.config.schema import SCHEDULES as SCHEDULES
from asyncrl.config.schema import Config as Config
from asyncrl.config.schema import DataConfig as DataConfig
from asyncrl.config.schema import ModelConfig as ModelConfig
from asyncrl.config.schema import PlacementConfig as PlacementConfig
from asyncrl.config.schema import PoolConfig as PoolConfig
from asyncrl.config.schema import RayConfig as RayConfig
from asyncrl.config.schema import TrainerConfig as TrainerConfig
from asyncrl.config.schema import WeightSyncConfig as WeightSyncConfig
from asyncrl.config.training import ActorConfig as ActorConfig
from asyncrl.config.training import AlgorithmConfig as AlgorithmConfig
from asyncrl.config.training import AsyncTrainingConfig as AsyncTrainingConfig
from asyncrl.config.training import CriticConfig as CriticConfig
from asyncrl.config.training import CriticModelConfig as CriticModelConfig
from asyncrl.config.training import DistillConfig as DistillConfig
from asyncrl.config.training import DpoConfig as DpoConfig
from asyncrl.config.training import FilterGroupsConfig as FilterGroupsConfig
from asyncrl.config.training import OptimConfig as OptimConfig
from asyncrl.config.training import OverlongBufferConfig as OverlongBufferConfig
from asyncrl.config.training import RewardKwargsConfig as RewardKwargsConfig
from asyncrl.config.training import RewardModelConfig as RewardModelConfig
from asyncrl.config.training import RolloutCorrectionConfig as RolloutCorrectionConfig
from asyncrl.config.training import TeacherConfig as TeacherConfig
