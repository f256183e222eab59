"""A rollout-only worker for the schedules with a rollout pool: the built-in engine over its own copy of the policy,
fed new weights by the trainer over the sync group (``SyncReceiverMixin``), bucket by bucket. It never trains; it
records the version that produced every token and scores each sample's rule reward as soon as it is generated, off
the trainer's critical path. A rank of the fully_async Rollouter also streams a share of its groups here
(``stream_*``, over ``asyncrl.workers.stream_loop``).
"""

from __future__ import annotations

from asyncrl.config.specs import RolloutSpec
from asyncrl.models.device import resolve_device
from asyncrl.rewards.loop import build_reward_loop, generate_scored
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.rollout.factory import rollout_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Generation, PrefillStats, Prompt, Sample
from asyncrl.weights.endpoints import SyncReceiverMixin
from asyncrl.workers.backends import RoleWorker
from asyncrl.workers.stream_loop import StreamLoop


class RolloutWorker(SyncReceiverMixin, RoleWorker):
    def __init__(self, spec: RolloutSpec, name: str = "rollout0", num_threads: int | None = None):
        super().__init__(name, num_threads)
        self.device = resolve_device(spec.engine.device, name)
        self.engine = rollout_engine(spec.engine, self.device)
        self.reward_fn = build_reward_fn(spec.reward.custom_function, binarize=spec.reward.binarize)
        self.scorer = build_reward_loop(spec.reward, self.reward_fn)
        # a rank of the fully_async Rollouter: its engine steps on a thread of its own (started by the first submit)
        self.stream_loop = StreamLoop(self.engine, self.timeline, self.name)

    def generate(
        self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1, score: bool = True
    ) -> Generation:
        return generate_scored(self.engine, self.scorer, self.timeline, self.name, prompts, params, seed, step, score)

    def version(self) -> int:
        return self.engine.version

    # ---- a rank of the fully_async Rollouter (which streams a share of its groups here): ``RolloutWorkerClient``
    # says what each call does
    def stream_submit(self, rows: list[Sample], params: SamplingParams, seed: int) -> None:
        self.stream_loop.submit(rows, params, seed)

    def stream_wait(self, timeout_s: float) -> tuple[list[Sample], PrefillStats]:
        return self.stream_loop.wait(timeout_s)

    def stream_interrupt(self, timeout_s: float) -> list[Sample]:
        return self.stream_loop.interrupt(timeout_s)

    def halt(self, timeout_s: float) -> None:
        """Drop the rows a dead Rollouter left streaming here (its replacement re-issues them), so the weight sync
        that follows finds the engine idle."""
        self.stream_loop.interrupt(timeout_s)
