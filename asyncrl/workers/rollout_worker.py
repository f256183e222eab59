"""A rollout-only worker: the built-in engine over its own copy of the policy, fed new weights by the trainer.

Used by modes with a separate rollout pool (``one_step_off``). It never trains; it receives weights over the sync
group (``SyncReceiverMixin.receive_weights`` -> ``RolloutEngine.update_weights``) and records the version that
produced every token.
"""

from __future__ import annotations

import os
import time

import torch

from asyncrl.config import Config
from asyncrl.models.loading import load_model
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.sync.ray_sync import SyncReceiverMixin
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Prompt, Sample


class RolloutWorker(SyncReceiverMixin):
    def __init__(self, cfg: Config, name: str = "rollout0", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        model, tokenizer = load_model(cfg.model.path, dtype=cfg.model.dtype, for_training=False)
        self.engine = RolloutEngine(model, tokenizer, max_batch_size=cfg.rollout.max_batch_size)
        self.timeline = get_timeline()
        self.timeline.worker = name

    def generate(self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1) -> list[Sample]:
        with self.timeline.span("generate", step=step, worker=self.name, version=self.engine.version):
            return self.engine.generate(prompts, params, seed=seed)

    def generate_timed(
        self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1
    ) -> tuple[list[Sample], float]:
        """``generate`` plus its wall seconds on this worker (the pipeline's ``timing_s/gen``)."""
        t0 = time.perf_counter()
        samples = self.generate(prompts, params, seed, step)
        return samples, time.perf_counter() - t0

    def version(self) -> int:
        return self.engine.version

    def pop_timeline(self) -> list[dict]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()
