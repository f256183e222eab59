"""A rollout-only worker: the built-in engine over its own copy of the policy, fed new weights by the trainer.

Used by the schedules with a rollout pool (one_step_off, two_step_off; the fully_async Rollouter builds on it). It
never trains; it receives weights over the sync group (``SyncReceiverMixin.receive_weights`` ->
``RolloutEngine.update_weights``), records the version that produced every token, and scores each sample's rule
reward as soon as it is generated, so rewards are computed where the samples are, off the trainer's critical path.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from asyncrl.config.specs import RolloutSpec
from asyncrl.models.device import resolve_device
from asyncrl.rewards.generate import generate_scored
from asyncrl.rewards.loop import build_reward_loop
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.rollout.factory import rollout_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Generation, Prompt
from asyncrl.weights.endpoints import SyncReceiverMixin


class RolloutWorker(SyncReceiverMixin):
    def __init__(self, spec: RolloutSpec, name: str = "rollout0", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        self.device = resolve_device(spec.engine.device, name)
        self.engine = rollout_engine(spec.engine, self.device)
        self.reward_fn = build_reward_fn(spec.reward.custom_function, binarize=spec.reward.binarize)
        self.scorer = build_reward_loop(spec.reward, self.reward_fn) or self.reward_fn
        self.timeline = get_timeline()
        self.timeline.worker = name

    def generate(
        self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1, score: bool = True
    ) -> Generation:
        return generate_scored(self.engine, self.scorer, self.timeline, self.name, prompts, params, seed, step, score)

    def version(self) -> int:
        return self.engine.version

    def save_checkpoint(self, directory: str) -> None:
        """Nothing of its own to save: its weights are the trainer's, re-sent after a resume."""

    def load_checkpoint(self, directory: str) -> Any:
        return None

    def pop_timeline(self) -> list[dict]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()
