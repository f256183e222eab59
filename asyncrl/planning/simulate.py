"""Every schedule's order of events on a virtual clock, each engine and trainer call replaced by its price in a
``CostModel``, on a described cluster.

``sync``, ``one_step_off`` and ``two_step_off`` run the run's own loops (``schedules.loops``) over
``planning.sim_ports`` (their decode calls: ``planning.decode``), ``fully_async`` both its loops over
``planning.stream``: a loop changed there changes the prediction. ``Cluster.cpu``: every role shares the cores (a
computation's alone speed on t threads is Amdahl's law with the profile's serial fraction); ``Cluster.gpus``: each
role on devices of its own, a phase's seconds scaled by its devices against the profile's (rows over replicas, tokens
over ranks) and ``device_speed``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from asyncrl.config.schema import SCHEDULES
from asyncrl.planning.clock import Clock, Compute
from asyncrl.planning.cost import CostModel, update_positions
from asyncrl.planning.decode import Row, decode
from asyncrl.planning.setting import Cluster, Prediction, Prices, Setting, Span, Work
from asyncrl.planning.sim_ports import SimPorts
from asyncrl.planning.stream import StreamSim
from asyncrl.schedules.fully_async.slots import budget_of
from asyncrl.schedules.loops import LOOPS
from asyncrl.telemetry.timeline import union_seconds

__all__ = ["SCHEDULES", "Cluster", "Fault", "Prediction", "Setting", "Sim", "median_step", "simulate"]


# ---- the schedules ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """``kill``: the run is killed late and resumes from the checkpoint of the first sync at or after update
    ``after_update``; ``takeover``: the Rollouter dies right after update ``after_update`` and a new one takes over."""

    kind: str
    after_update: int


class Sim(StreamSim):
    """One simulated run. ``steps``: trainer updates; ``dataset_size``: prompts per epoch of the fully_async
    producer's sampler (shuffled with ``seed``; default: more than the run draws)."""

    def __init__(
        self,
        cost: CostModel,
        cluster: Cluster,
        setting: Setting,
        steps: int,
        seed: int = 0,
        dataset_size: int | None = None,
        fault: Fault | None = None,
    ):
        if setting.schedule not in SCHEDULES:
            raise ValueError(f"no schedule {setting.schedule!r} (known: {', '.join(SCHEDULES)})")
        self.cost, self.cluster, self.setting, self.steps = cost, cluster, setting, steps
        self.seed, self.fault, self.faulted = seed, fault, False
        self.consumed: list[tuple[str, int, int]] = []  # fully_async: (group, controller's staleness, rows' own)
        b = self.budget = budget_of(setting, cost.ppo_mini_batch_size)
        # enough prompts that the run never wraps an epoch (a smaller set is shuffled faster than a large one)
        self.dataset_size = dataset_size or (steps + 2) * b.groups_per_update + 2 * b.groups_per_window_budget + 4096
        self.prices = Prices(cost, cluster, setting)
        self.clock = Clock(cluster.cores if cluster.kind == "cpu" else None, self.prices.oversubscribed)
        self.work = Work(cost, seed)
        self.spans: list[Span] = []
        self.step_ends: list[float] = []
        self.staleness: Counter[int] = Counter()
        self.partial = 0
        self.samples = 0

    # a timed span of a process
    def busy(self, worker: str, name: str, step: int, op):
        t0 = self.clock.now
        yield op
        self.spans.append(Span(worker, name, t0, self.clock.now, step))

    def draw_batch(self, b: int) -> list[tuple[int, tuple[int, ...]]]:
        return [self.work.group(0, b * 100_000 + i) for i in range(self.cost.prompts_per_step)]

    def generate(self, worker: str, step: int, groups: list[tuple[int, tuple[int, ...]]]):
        rows = [Row(r, p, g) for g, (p, rs) in enumerate(groups) for r in rs]
        t0 = self.clock.now
        yield from decode(self.prices, rows)
        self.spans.append(Span(worker, "generate", t0, self.clock.now, step))
        yield from self.busy(worker, "reward", step, Compute(self.cost.reward(row=len(rows)), 1.0, self.prices.pool))

    def prepare(self, worker: str, step: int, groups: list[tuple[int, tuple[int, ...]]]):
        positions = update_positions(groups, shared_prefix=False)  # every row's prompt and response (a teacher's)
        yield from self.busy(worker, "prepare", step, Compute(self.cost.prepare_s(positions), 1.0, self.prices.pool))

    def train(self, step: int, groups: list[tuple[int, tuple[int, ...]]]):
        p = self.prices
        yield from self.busy(
            "trainer", "train", step, Compute(p.train_s(self.work.update_tokens(groups)), p.train_threads, p.pool)
        )

    def end_step(self, step: int, n_samples: int):
        yield from self.busy(
            "driver", "step_other", step, Compute(self.cost.step_other(call=1.0), 1.0, self.prices.pool)
        )
        self.step_ends.append(self.clock.now)
        self.samples += n_samples

    def run(self) -> Prediction:
        """The schedule's own loop (``schedules.loops``; fully_async's: ``planning.stream``) on the virtual clock."""
        sched = self.setting.schedule
        proc = self.fully_async() if sched == "fully_async" else LOOPS[sched](SimPorts(self))
        self.clock.spawn(proc)
        self.clock.run(until=lambda: proc.gi_frame is None)  # the trainer's loop ended (a Rollouter may run on)
        if proc.gi_frame is not None:
            books = self.producer.controller.metrics() if sched == "fully_async" else {}
            raise RuntimeError(
                f"simulation of {self.setting.label()} stalled after {len(self.step_ends)} steps {books}"
            )
        ends = self.step_ends
        first = 1 if len(ends) > 2 else 0
        t0 = ends[first - 1] if first else 0.0
        measured = len(ends) - first
        window = ends[-1] - t0
        step_s = window / measured
        per_step = self.samples / len(ends)
        return Prediction(
            setting=self.setting,
            steps=len(ends),
            step_s=step_s,
            samples_per_s=per_step / step_s,
            trainer_idle=1.0 - _busy(self.spans, "trainer", t0, ends[-1]) / window,
            rollout_idle=0.0 if sched == "sync" else 1.0 - _busy(self.spans, "rollout", t0, ends[-1]) / window,
            staleness=dict(sorted(self.staleness.items())),
            partial_share=self.partial / max(1, sum(self.staleness.values())),
            spans=self.spans,
            step_ends=ends,
        )


def _busy(spans: list[Span], worker: str, t0: float, t1: float) -> float:
    """Seconds of ``[t0, t1]`` in which ``worker`` ran a span."""
    return union_seconds(
        (max(s.start, t0), min(s.end, t1)) for s in spans if s.worker == worker and s.end > t0 and s.start < t1
    )


def simulate(cost: CostModel, cluster: Cluster, setting: Setting, steps: int = 30, seed: int = 0) -> Prediction:
    """One setting's run of ``steps`` steps on ``cluster``."""
    return Sim(cost, cluster, setting, steps, seed).run()


def median_step(pred: Prediction) -> float:
    ends = pred.step_ends
    return statistics.median(b - a for a, b in zip(ends, ends[1:])) if len(ends) > 1 else ends[0]
