"""A rollout-only worker: the built-in engine over its own copy of the policy, fed new weights by the trainer.

Used by the schedules with a rollout pool (one_step_off, two_step_off; the fully_async Rollouter builds on it). It
never trains; it receives weights over the sync group (``SyncReceiverMixin.receive_weights`` ->
``RolloutEngine.update_weights``), records the version that produced every token, and scores each sample's rule
reward as soon as it is generated, so rewards are computed where the samples are, off the trainer's critical path.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from asyncrl.config import Config
from asyncrl.rewards.reward_fn import RewardFn, build_reward_fn
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.factory import rollout_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.sync.endpoints import SyncReceiverMixin
from asyncrl.telemetry.timeline import Timeline, get_timeline
from asyncrl.types import Generation, Prompt


def generate_scored(
    engine: RolloutEngine,
    reward_fn: RewardFn,
    timeline: Timeline,
    worker: str,
    prompts: list[Prompt],
    params: SamplingParams,
    seed: int,
    step: int,
    score: bool,
) -> Generation:
    """Generate, then (``score``) fill each sample's rule reward; the seconds are this worker's wall time."""
    t0 = time.perf_counter()
    with timeline.span("generate", step=step, worker=worker, version=engine.version):
        samples = engine.generate(prompts, params, seed=seed)
    if score:
        with timeline.span("reward", step=step, worker=worker):
            reward_fn.score(samples)
    return Generation(samples, time.perf_counter() - t0, engine.last_prefill)


class RolloutWorker(SyncReceiverMixin):
    def __init__(self, cfg: Config, name: str = "rollout0", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        self.engine = rollout_engine(cfg)
        self.reward_fn = build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize)
        self.timeline = get_timeline()
        self.timeline.worker = name

    def generate(
        self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1, score: bool = True
    ) -> Generation:
        return generate_scored(
            self.engine, self.reward_fn, self.timeline, self.name, prompts, params, seed, step, score
        )

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
