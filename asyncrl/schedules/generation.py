"""Generation on a rollout pool: a batch's prompts split over the workers, waited for together.

With a ``RolloutPool`` (``asyncrl.supervision.supervisor``; Ray runs of the schedules with a pool), a worker that dies
or hangs while generating its share is replaced and the share generated again on the new worker, same prompts and
seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.calls import Pending
from asyncrl.rewards.loop import merge_metrics
from asyncrl.roles.clients import RolloutClient
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.supervision.supervisor import RolloutPool
from asyncrl.types import Generation, PrefillStats, Prompt, Sample


@dataclass
class Generated:
    """A generated batch: its samples in prompt order per worker, the slowest worker's seconds, and what the
    rollout engines reported (``perf/rollout_prefill_saving``: the share of prompt tokens not prefilled because an
    identical prompt was; ``perf/rollout_tokens_per_s``: response tokens generated per second of the slowest call)."""

    samples: list[Sample]
    seconds: float
    metrics: dict[str, float]


@dataclass
class Launched:
    """A batch being generated on the rollout side (not waited for yet)."""

    calls: list[Pending[Generation]]
    pool: RolloutPool | None = None  # replaces a worker that dies and generates its share again
    workers: list[int] = field(default_factory=list)  # the rollout worker of each call
    again: list[Callable[[RolloutClient], Pending[Generation]]] = field(default_factory=list)  # each call, re-issued

    def result(self) -> Generated:
        if self.pool is None:
            gens = [c.result() for c in self.calls]
        else:
            gens = [self.pool.wait(i, c, redo) for i, c, redo in zip(self.workers, self.calls, self.again)]
        prefill = sum((g.prefill for g in gens), PrefillStats())
        samples, seconds = [s for g in gens for s in g.samples], max(g.seconds for g in gens)
        rate = {"perf/rollout_tokens_per_s": sum(len(s.response_ids) for s in samples) / seconds} if seconds > 0 else {}
        rewards = merge_metrics([g.reward_metrics for g in gens])
        return Generated(samples, seconds, {**prefill.metrics(), **rate, **rewards})


def launch_generation(
    rollouts: list[RolloutClient],
    prompts: list[Prompt],
    params: SamplingParams,
    seed: int,
    step: int,
    pool: RolloutPool | None = None,
) -> Launched:
    """Split ``prompts`` over the rollout side (whole prompts: a group stays on one worker); not waited for."""
    k = len(rollouts)
    chunks = [prompts[i::k] for i in range(k)]
    workers = [i for i in range(k) if chunks[i]]

    def issue(i: int) -> Callable[[RolloutClient], Pending[Generation]]:
        return lambda w: w.generate(chunks[i], params, seed, step)  # rows key their own noise (seeds.row_keys)

    again = [issue(i) for i in workers]
    return Launched([redo(rollouts[i]) for i, redo in zip(workers, again)], pool, workers, again)
