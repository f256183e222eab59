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

from asyncrl.config.specs import RolloutSpec
from asyncrl.models.device import resolve_device
from asyncrl.rewards.generate import generate_scored
from asyncrl.rewards.loop import build_reward_loop
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.rollout.factory import rollout_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Generation, PrefillStats, Prompt, Sample
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

    # ---- a rank of the fully_async Rollouter (which decodes a share of its rows here) -----------------------------
    def resume_rows(self, rows: list[Sample], params: SamplingParams, seed: int) -> tuple[list[Sample], PrefillStats]:
        """Decode ``rows`` (blank or partial) until each ends or a pause is requested; the engine's prefill counts."""
        with self.timeline.span("generate", worker=self.name, version=self.engine.version, rows=len(rows)):
            out = self.engine.resume(rows, params, seed=seed)
        return out, self.engine.last_prefill

    def request_pause(self) -> None:
        """Make a running ``resume_rows`` return at its next decode step (called while it runs: a threaded worker)."""
        self.engine.request_pause()

    def clear_pause(self) -> None:
        self.engine.clear_pause()

    def halt(self, timeout_s: float) -> None:
        """Stop a decode a dead Rollouter left running here, and wait until the engine is idle (a weight sync
        follows, which an engine refuses while it decodes)."""
        self.engine.request_pause()
        end = time.monotonic() + timeout_s
        while self.engine.busy and time.monotonic() < end:
            time.sleep(0.01)
        self.engine.clear_pause()

    def save_checkpoint(self, directory: str) -> None:
        """Nothing of its own to save: its weights are the trainer's, re-sent after a resume."""

    def load_checkpoint(self, directory: str) -> Any:
        return None

    def pop_timeline(self) -> list[dict]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()
