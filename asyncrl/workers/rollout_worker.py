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
from asyncrl.rewards.loop import RewardLoop, build_reward_loop
from asyncrl.rewards.reward_fn import RewardFn, build_reward_fn
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.factory import rollout_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.telemetry.timeline import Timeline, get_timeline
from asyncrl.types import Generation, Prompt
from asyncrl.weights.endpoints import SyncReceiverMixin


def generate_scored(
    engine: RolloutEngine,
    scorer: RewardFn | RewardLoop,
    timeline: Timeline,
    worker: str,
    prompts: list[Prompt],
    params: SamplingParams,
    seed: int,
    step: int,
    score: bool,
) -> Generation:
    """Generate, then (``score``) fill each sample's rule reward; the seconds are this worker's wall time. With a
    reward loop (``reward.async_loop``), an engine that reports finished rows has each scored while it decodes."""
    t0 = time.perf_counter()
    streams = score and isinstance(scorer, RewardLoop) and getattr(engine, "reports_finished_rows", False)
    with timeline.span("generate", step=step, worker=worker, version=engine.version):
        if streams:
            samples = engine.generate(prompts, params, seed=seed, on_sample=scorer.submit)  # type: ignore[union-attr]
        else:
            samples = engine.generate(prompts, params, seed=seed)
    metrics: dict[str, float] = {}
    if score:
        with timeline.span("reward", step=step, worker=worker):
            metrics = scorer.score(samples)
    return Generation(samples, time.perf_counter() - t0, engine.last_prefill, metrics)


class RolloutWorker(SyncReceiverMixin):
    def __init__(self, cfg: Config, name: str = "rollout0", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        self.engine = rollout_engine(cfg)
        self.reward_fn = build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize)
        self.scorer = build_reward_loop(cfg.reward, self.reward_fn) or self.reward_fn
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
