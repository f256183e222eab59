"""Generate on a rollout engine and score each sample's rule reward where it was made: what a rollout worker and the
sync schedule's trainer do for every batch. The engine and the timeline are passed in (any engine with
``generate``, ``version`` and ``last_prefill``, and ``last_segments`` where it measures its decode steps;
``asyncrl.telemetry.timeline.Timeline``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from asyncrl.rewards.loop import RewardLoop
from asyncrl.types import Generation, PrefillStats, Prompt, Sample, SamplingParams


class GeneratingEngine(Protocol):
    """What ``generate_scored`` uses of an engine (the built-in one, vLLM's, an ``AgentEngine`` over either):
    ``on_samples`` is passed only where ``reports_finished_rows`` is true, ``last_segments`` read where it exists."""

    version: int
    last_prefill: PrefillStats

    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        seed: int | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]: ...


class Spans(Protocol):
    """What ``generate_scored`` records on a timeline (``asyncrl.telemetry.timeline.Timeline``, a floor above)."""

    def span(
        self, name: str, step: int | None = None, worker: str | None = None, **args: object
    ) -> AbstractContextManager[None]: ...

    def instant(self, name: str, step: int | None = None, worker: str | None = None, **args: object) -> None: ...


def generate_scored(
    engine: GeneratingEngine,
    scorer: RewardLoop,
    timeline: Spans,
    worker: str,
    prompts: list[Prompt],
    params: SamplingParams,
    seed: int,
    step: int,
    score: bool,
) -> Generation:
    """Generate, then (``score``) fill each sample's rule reward; the seconds are this worker's wall time. An engine
    that reports finished rows has them scored on the reward loop as their decode step ends, while the others decode;
    the rest are scored when the call returns."""
    t0 = time.perf_counter()
    streams = score and getattr(engine, "reports_finished_rows", False)
    with timeline.span("generate", step=step, worker=worker, version=engine.version):
        if streams:
            samples = engine.generate(prompts, params, seed=seed, on_samples=scorer.submit_all)
        else:
            samples = engine.generate(prompts, params, seed=seed)
        # this call's measurements, read at once: the built-in engine's decode steps by batch size (``asyncrl
        # profile`` fits them) and the prefill counts
        segments, prefill = [list(s) for s in getattr(engine, "last_segments", ())], engine.last_prefill
    if segments:
        timeline.instant("decode_segments", step=step, worker=worker, segments=segments)
    metrics: dict[str, float] = {}
    if score:
        with timeline.span("reward", step=step, worker=worker):
            metrics = scorer.score(samples)
    return Generation(samples, time.perf_counter() - t0, prefill, metrics)
