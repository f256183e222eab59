"""What every schedule's step measures: its wall-clock timings, the staleness of what it trained, and the old
policy a schedule uses unless it decides otherwise."""

from __future__ import annotations

import time
from contextlib import contextmanager

from asyncrl.config import Config
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Sample


def old_policy(cfg: Config) -> str:
    """The PPO ratio's denominator a schedule uses unless it decides otherwise: the behaviour log-probs
    (``actor.use_rollout_log_probs``, bypass mode) or the trainer's current weights."""
    return "behaviour" if cfg.actor.use_rollout_log_probs else "actor"


def staleness_metrics(samples: list[Sample], trainer_version: int) -> dict[str, float]:
    """Staleness of each sample = the trainer's version at the update that consumes it minus the version its
    generation started with, computed from what the engine recorded (never assumed from the schedule)."""
    st = [trainer_version - s.start_version for s in samples]
    return {"staleness/mean": sum(st) / len(st), "staleness/max": float(max(st))}


class StepTimer:
    """Collects ``timing_s/<name>`` wall-clock seconds for one step, and records each as a driver span."""

    def __init__(self, step: int):
        self.step = step
        self.timings: dict[str, float] = {}
        self.timeline = get_timeline()

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        with self.timeline.span(name, step=self.step, worker="driver"):
            yield
        self.timings[f"timing_s/{name}"] = self.timings.get(f"timing_s/{name}", 0.0) + time.perf_counter() - t0
