"""asyncrl: RL post-training of language models where generation and training run at once.

The public surface (docs/api.md) is imported on first use, so that ``import asyncrl`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# the module that defines them -> the public names
_PUBLIC = {
    "asyncrl.api": ("load_config", "train", "TrainResult"),
    "asyncrl.config.schema": ("Config",),
    "asyncrl.models.loading": ("load_model",),
    "asyncrl.data.dataset": ("PromptDataset",),
    "asyncrl.data.rows": ("load_rows",),
    "asyncrl.rollout.engine": ("RolloutEngine",),
    "asyncrl.types": ("SamplingParams", "Sample", "Prompt"),
    "asyncrl.rewards.reward_fn": ("RewardFn",),
    "asyncrl.data.collate": ("collate", "group_ids", "rewards_of"),
    "asyncrl.trainer.forward": ("forward_logits",),
    "asyncrl.run.evaluation": ("evaluate_prompts",),
    "asyncrl.finetune.sft": ("load_sft_config", "run_sft"),
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}
_MODULES = {"losses": "asyncrl.losses"}

__all__ = ["__version__", *_MODULE_OF, *_MODULES]


def __getattr__(name: str):
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'asyncrl' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # the names __getattr__ resolves, for type checkers
    from asyncrl import losses as losses
    from asyncrl.api import TrainResult as TrainResult
    from asyncrl.api import load_config as load_config
    from asyncrl.api import train as train
    from asyncrl.config.schema import Config as Config
    from asyncrl.data.collate import collate as collate
    from asyncrl.data.collate import group_ids as group_ids
    from asyncrl.data.collate import rewards_of as rewards_of
    from asyncrl.data.dataset import PromptDataset as PromptDataset
    from asyncrl.data.rows import load_rows as load_rows
    from asyncrl.finetune.sft import load_sft_config as load_sft_config
    from asyncrl.finetune.sft import run_sft as run_sft
    from asyncrl.models.loading import load_model as load_model
    from asyncrl.rewards.reward_fn import RewardFn as RewardFn
    from asyncrl.rollout.engine import RolloutEngine as RolloutEngine
    from asyncrl.run.evaluation import evaluate_prompts as evaluate_prompts
    from asyncrl.trainer.forward import forward_logits as forward_logits
    from asyncrl.types import Prompt as Prompt
    from asyncrl.types import Sample as Sample
    from asyncrl.types import SamplingParams as SamplingParams
