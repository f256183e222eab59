"""The real run's ``StreamPorts`` (``loop.consume``): each phase calls the roles and the Rollouter's supervisor, timed
as every schedule's step is (``timing_s/*``), and the step tail writes fully_async's metrics."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

from asyncrl.algorithms import Algorithm, Prepared, Trained
from asyncrl.run import Run
from asyncrl.run.step_log import StepTimer, staleness_metrics
from asyncrl.schedules.fully_async.recovery import ROLLOUTER_STATE, RollouterSnapshot, StreamBatch
from asyncrl.schedules.fully_async.report import partial_metrics, processing_metrics
from asyncrl.schedules.fully_async.supervisor import StreamSupervisor
from asyncrl.schedules.loops import clock_step
from asyncrl.schedules.run_ports import TrainPort
from asyncrl.weights.weight_sync import WeightSync


class StreamRunPorts(TrainPort):
    """``run`` (its ``stream`` is the Rollouter's supervisor, which pushes the weights) and ``algorithm``.
    ``finished``: the last step that ended."""

    def __init__(self, run: Run, algorithm: Algorithm):
        self.run, self.algorithm = run, algorithm
        self.stream: StreamSupervisor = run.stream
        self.cfg = run.cfg
        self.budget = self.stream.budget
        self.finished = run.start_step - 1
        self.tm = StepTimer(0)
        self.open = ExitStack()  # the step's own span: from take to the end of its push
        self.trained_at = 0
        self.extra: dict[str, float] = {}
        self.snapshot: RollouterSnapshot | None = None

    def steps(self) -> Iterator[int]:
        yield from range(self.run.start_step, self.cfg.trainer.total_training_steps + 1)

    @clock_step
    def take(self, step: int) -> StreamBatch:
        self.tm, self.extra, self.snapshot = StepTimer(step), {}, None
        self.open.enter_context(self.tm("step"))
        self.trained_at = self.run.version
        with self.tm("wait_batch"):
            return self.stream.get_batch(self.budget.groups_per_update, self.trained_at)

    @clock_step
    def prepare(self, got: StreamBatch, step: int) -> Prepared:
        with self.tm("prepare"):
            return self.algorithm.prepare(got.samples, step)()

    def window_ended(self) -> bool:
        """The update moved the trainer's version on: the rollout side gets the new weights."""
        return self.run.version != self.trained_at

    @clock_step
    def push(self, step: int) -> None:
        with self.tm("param_sync"):
            save = self.run.log.due(self.cfg.trainer.save_freq, step)
            paused, stats, snap = self.stream.push(self.run.version, self.cfg.async_training.partial_rollout, save)
            self.extra["timing_s/param_sync_pause"] = paused
            self.extra.update(WeightSync.metrics(stats) if stats is not None else {})
            self.snapshot = snap if save else None

    @clock_step
    def end_step(self, step: int, got: StreamBatch, prepared: Prepared, trained: Trained) -> None:
        tm = self.tm
        self.open.close()
        at = self.cfg.async_training
        bound = self.budget.max_staleness if at.staleness_rule == "exact" else None
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
