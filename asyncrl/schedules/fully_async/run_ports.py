"""The real run's ``StreamPorts`` (``loop.consume``): each phase calls the roles and the Rollouter's supervisor, timed
as every schedule's step is (``timing_s/*``), and the step tail writes fully_async's metrics."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from asyncrl.run.step_log import StepTimer, staleness_metrics
from asyncrl.schedules.fully_async.recovery import ROLLOUTER_STATE
from asyncrl.schedules.fully_async.report import partial_metrics, processing_metrics
from asyncrl.schedules.fully_async.slots import budget_of
from asyncrl.schedules.run_ports import TrainPort


class StreamRunPorts(TrainPort):
    """``run`` (``asyncrl.run.Run``: its ``stream`` is the Rollouter's supervisor, its ``sync`` the weight sync it
    pushes with) and ``algorithm``. ``finished``: the last step that ended."""

    def __init__(self, run: Any, algorithm: Any):
        self.run, self.algorithm, self.stream, self.sync = run, algorithm, run.stream, run.sync
        self.cfg = run.cfg
        self.groups_per_step = self.cfg.async_training.require_batches * self.cfg.actor.ppo_mini_batch_size
        self.max_staleness = budget_of(self.cfg.async_training, self.cfg.actor.ppo_mini_batch_size).max_staleness
        self.finished = run.start_step - 1
        self.tm = StepTimer(0)
        self.open = ExitStack()  # the step's own span: from take to the end of its push
        self.trained_at = 0
        self.extra: dict[str, float] = {}
        self.snapshot: Any = None

    def steps(self) -> Iterator[int]:
        yield from range(self.run.start_step, self.cfg.trainer.total_training_steps + 1)

    def take(self, step: int):
        self.tm, self.extra, self.snapshot = StepTimer(step), {}, None
        self.open.enter_context(self.tm("step"))
        self.trained_at = self.run.version
        with self.tm("wait_batch"):
            got = self.stream.get_batch(self.groups_per_step, self.trained_at)
        return got
        yield  # a generator: the real ports never yield

    def prepare(self, got: Any, step: int):
        with self.tm("prepare"):
            return self.algorithm.prepare(got.samples, step)()
        yield

    def window_ended(self) -> bool:
        """The update moved the trainer's version on: the rollout side gets the new weights."""
        return self.run.version != self.trained_at

    def push(self, step: int):
        with self.tm("param_sync"):
            save = self.run.log.due(self.cfg.trainer.save_freq, step)
            paused, stats, snap = self.stream.push(self.run.version, self.cfg.async_training.partial_rollout, save)
            self.extra["timing_s/param_sync_pause"] = paused
            self.extra.update(self.sync.metrics(stats) if stats is not None else {})
            self.snapshot = snap if save else None
        return
        yield

    def end_step(self, step: int, got: Any, prepared: Any, trained: Any):
        tm = self.tm
        self.open.close()
        at = self.cfg.async_training
        bound = self.max_staleness if at.staleness_rule == "exact" else None
        staleness = staleness_metrics(got.samples, self.trained_at, bound)
        if max(got.staleness) != staleness["staleness/max"]:  # two accounts of the same fact
            raise RuntimeError(f"step {step}: controller staleness {got.staleness} != recorded {staleness}")
        ro = self.stream.metrics()
        last = {
            **partial_metrics(got.samples),
            **processing_metrics(got.processing_s),
            "trainer/idle_ratio": tm.timings["timing_s/wait_batch"] / tm.timings["timing_s/step"],
            "timing_s/gen": ro.get("rollouter/busy_s", 0.0),  # the Rollouter's decode seconds this step
            "fully_async/trainer_version": float(self.trained_at),  # the version this step's update ran at
        }
        files = {ROLLOUTER_STATE: self.snapshot} if self.snapshot else None
        self.run.end_step(step, prepared, trained, tm, self.extra, ro, last=last, extra_files=files)
        self.finished = step
        return
        yield
