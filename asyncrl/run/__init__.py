"""The parts of a training run that every schedule shares (docs/design.md, floor 4), and ``Run``, which holds them.

``Run`` is built whole, after the roles started, the checkpoint was restored and the weight sync set up
(``asyncrl.schedules.run_ports.open_run``), and handed to the schedule: nothing is attached to it afterwards. The
order of events is the schedule's; ``Run`` ends every schedule's step the same way (``end_step``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import Config
from asyncrl.data.collate import Prepared
from asyncrl.rewards.reward_fn import RewardFn
from asyncrl.roles.clients import Roles
from asyncrl.run.directory import Progress, RunDir
from asyncrl.run.evaluation import held_out
from asyncrl.run.generation import PromptStream
from asyncrl.run.step_log import StepLog, StepTimer
from asyncrl.run.supervision import RolloutPool
from asyncrl.types import Sample, Trained
from asyncrl.weights.weight_sync import WeightSync


@dataclass(eq=False)
class Run:
    """One run's parts. ``sync`` and the supervisor that replaces a dead rollout worker (``pool``, or fully_async's
    ``stream``) exist only on a schedule with a rollout side."""

    cfg: Config
    dir: RunDir
    prompts: PromptStream
    progress: Progress
    log: StepLog
    roles: Roles
    reward_fn: RewardFn
    sync: WeightSync | None = None
    pool: RolloutPool | None = None
    stream: Any = None  # asyncrl.schedules.fully_async.supervisor.StreamSupervisor

    @property
    def version(self) -> int:
        """The trainer's weight version, as it last reported it."""
        return self.progress.version

    @property
    def start_step(self) -> int:
        return self.progress.start_step

    # ---- the update ------------------------------------------------------------------------------------------------
    def consuming(self, samples: list[Sample], step: int) -> None:
        """Before a step's update: the version it consumes ``samples`` at (the trace's, the staleness'), and with
        ``trainer.record_consumed`` the samples, for ``asyncrl replay``."""
        self.progress.consumed_version = self.progress.version
        if self.cfg.trainer.record_consumed:
            self.dir.record_consumed(step, samples)

    def trained(self, trained: Trained, samples: int, step: int) -> None:
        """After it: the trainer's new version, read from its result."""
        actor = trained.actor
        if actor is not None:
            self.progress.version = actor.version
            if actor.fingerprint is not None:
                self.dir.record_fingerprint(step, actor.fingerprint)
        self.progress.samples_trained += samples

    # ---- the step's end, every schedule's ----------------------------------------------------------------------------
    def end_step(
        self,
        step: int,
        prepared: Prepared,
        trained: Trained,
        tm: StepTimer,
        *parts: dict[str, float],
        last: dict[str, float] | None = None,
        sampler_state: dict | None = None,
        extra_files: Mapping[str, object] | None = None,
    ) -> dict[str, float]:
        """Metrics -> (held-out evaluation) -> log -> (checkpoint). The metrics: the samples' statistics, their
        staleness from the versions the engine recorded against the version the update consumed them at, what
        preparing and training measured, ``parts``, the step's timings, then ``last`` (which overrides). A checkpoint
        records ``sampler_state`` (default: the live cursor) and ``extra_files`` beside the workers' state."""
        metrics = self.log.metrics(prepared, trained, tm, self.progress.consumed_version, *parts)
        metrics.update(last or {})
        if self.log.due(self.cfg.trainer.test_freq, step):
            metrics.update(held_out(self, step))
        self.log.log(step, metrics)
        if self.log.due(self.cfg.trainer.save_freq, step):
            self.save(step, sampler_state, extra_files)
        return metrics

    def save(
        self, step: int, sampler_state: dict | None = None, extra_files: Mapping[str, object] | None = None
    ) -> Path:
        state = sampler_state or self.prompts.sampler.state_dict()
        return self.dir.save(step, self.roles.checkpointed, self.progress, state, extra_files)

    def save_before_failing(
        self, step: int, sampler_state: dict | None, extra_files: Mapping[str, object] | None = None
    ) -> None:
        """A checkpoint of the last finished ``step`` before the run stops on an error (none before the first step,
        none again for a step that has one), so ``resume_mode=auto`` loses nothing."""
        if step >= self.progress.start_step and not self.dir.has_checkpoint(step):
            self.save(step, sampler_state, extra_files)

    def evaluate_before_training(self) -> None:
        """``accuracy_before`` (logged as step 0) once per run: a resumed run already has it in its summary."""
        summary = self.dir.summary
        if "accuracy_before" in summary or self.prompts.val is None or not self.cfg.trainer.val_before_train:
            return
        acc = held_out(self, step=0)
        summary["accuracy_before"] = acc["val/accuracy"]
        self.log.log(0, acc)

    # ---- the end ---------------------------------------------------------------------------------------------------
    def finish(self, step: int) -> dict[str, Any]:
        """``accuracy_after``, the final model, ``summary.json`` and the merged timeline of every role."""
        summary = self.dir.summary
        last = self.dir.last_val_accuracy()
        if last is not None:
            summary["accuracy_after"] = last
        extra_events = self.roles.timelines()
        final = self.dir.path / "final"
        self.roles.trainer.export_model(str(final)).result()
        p = self.progress
        summary.update(
            steps=step, samples=p.samples_trained, wall_s=round(self.dir.wall_s(), 2), final_model=str(final)
        )
        supervisor = self.pool or self.stream
        if supervisor is not None:  # every rollout worker replaced in this run, and why
            summary["worker_restarts"] = [f"{worker}: {cause}" for worker, cause in supervisor.restarts]
        out = self.dir.write_end(extra_events, resumed=p.start_step > 1)
        self.log.close()
        return out
