"""The real run's ``Ports`` for the loops of ``schedules.loops``: the roles' calls, each phase timed.

A port method that takes time is written as a generator (the loops ``yield from`` it) but never yields: it does the
work and returns. What a step measures (``timing_s/*``, staleness from the recorded versions, the sync's metrics) and
how it ends (metrics -> evaluation -> log -> checkpoint, ``Run.end_step``) is here once for the three schedules.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from asyncrl.algorithms import Algorithm, Prepared, Trained
from asyncrl.roles.team import Roles
from asyncrl.schedules.dynamic_sampling import BatchFiller
from asyncrl.schedules.generation import Generated, Launched
from asyncrl.schedules.loops import LOOPS, Steps, run_to_end
from asyncrl.schedules.run import Run
from asyncrl.schedules.skip import Replayed, RolloutSkip
from asyncrl.schedules.step import StepTimer, staleness_metrics
from asyncrl.supervision.supervisor import WorkerLostError
from asyncrl.weights.weight_sync import WeightSync


class RunPorts:
    """``sync``: the schedule generates on the rollout pool, its weights pushed over this sync (None: on the trainer's
    own engine). ``prepare_pool``: the thread ``start_preparing`` finishes a batch's preparation on (two_step_off).
    The data cursor a checkpoint records is the one after the last batch this step trained: batches drawn beyond it
    (in flight) are drawn and generated again by a resumed run, neither lost nor repeated."""

    def __init__(
        self,
        run: Run,
        algorithm: Algorithm,
        roles: Roles,
        sync: WeightSync | None = None,
        prepare_pool: ThreadPoolExecutor | None = None,
    ):
        self.run, self.algorithm, self.roles, self.sync = run, algorithm, roles, sync
        self.prepare_pool = prepare_pool
        self.skip, self.filler, self.params = RolloutSkip(run.cfg), BatchFiller(run.cfg), run.sampling()
        self.start, self.total = run.start_step, run.cfg.trainer.total_training_steps
        self.last_step = run.start_step - 1
        self.cursors: dict[int, dict] = {run.start_step - 1: run.sampler.state_dict()}  # batch b -> cursor after it
        self.tm = StepTimer(0)
        self.sync_metrics: dict[str, float] = {}
        self._timing = ExitStack()

    # ---- the step ------------------------------------------------------------------------------------------------
    def steps(self) -> Iterator[int]:
        for step in range(self.start, self.total + 1):
            self.tm, self.sync_metrics = StepTimer(step), {}
            self._timing.enter_context(self.tm("step"))
            yield step
            self.last_step = step

    def end_step(self, step: int, generated: Generated, prepared: Prepared, trained: Trained) -> Steps:
        self._timing.close()
        metrics = self.run.step_metrics(
            prepared.samples,
            prepared.batch,
            self.tm,
            prepared.metrics,
            trained.metrics,
            # from the versions the engine recorded, against the version the update consumed them at
            staleness_metrics(prepared.samples, self.run.consumed_version),
            self.sync_metrics,
            generated.metrics,
        )
        if self.sync is not None:  # on the pool: measured on the rollout workers, overlapped with the step before
            metrics["timing_s/gen"] = generated.seconds
        self.run.end_step(step, metrics, self.roles, sampler_state=self.cursors[step])
        for b in [b for b in self.cursors if b < step]:
            del self.cursors[b]
        return
        yield

    # ---- generation ----------------------------------------------------------------------------------------------
    def launch(self, batch: int, gen_batch: int = 1) -> Launched | Replayed:
        """Batch ``batch``'s ``gen_batch``-th generation batch (dynamic sampling's extra ones: drawn before the next
        batch's first), on the pool or the trainer's engine; not waited for."""
        run = self.run
        prompts = run.next_prompts()
        self.cursors[batch] = run.sampler.state_dict()
        pool = run.pool if self.sync is not None else None
        return self.skip.launch(
            self.roles.rollouts, prompts, self.params, run.gen_seed(), batch, pool, gen_batch=gen_batch
        )

    def _fill(self, launched: Launched | Replayed, batch: int) -> Generated:
        return self.filler.fill(batch, launched, lambda g: self.launch(batch, g))

    def generate(self, batch: int) -> Steps:
        with self.tm("gen"):
            return self._fill(self.launch(batch), batch)
        yield

    def generated(self, launched: Launched | Replayed, batch: int) -> Steps:
        """Wait for a launched batch; a rollout worker the pool could not replace stops the run after a checkpoint
        of the last finished step."""
        try:  # the pool replaces a rollout worker that died; past its budget, stop after a checkpoint
            with self.tm("wait_prev_gen"):
                return self._fill(launched, batch)
        except WorkerLostError:
            self._save_before_failing()
            raise
        yield

    def push(self, step: int) -> Steps:
        assert self.sync is not None
        try:
            with self.tm("sync_rollout_weights"):
                self.sync_metrics = self.sync.metrics((self.run.pool or self.sync).push(self.run.version))
        except WorkerLostError:
            self._save_before_failing()
            raise
        return
        yield

    def _save_before_failing(self) -> None:
        self.run.save_before_failing(self.last_step, self.roles, self.cursors.get(self.last_step))

    # ---- preparation and update ----------------------------------------------------------------------------------
    def prepare(self, generated: Generated, step: int) -> Steps:
        with self.tm("prepare"):
            return self.algorithm.prepare(generated.samples, step)()
        yield

    def start_preparing(self, generated: Generated, batch: int) -> Future[tuple[Prepared, Generated]]:
        """Issued here, in batch order; finished on the preparation thread."""
        assert self.prepare_pool is not None
        finish = self.algorithm.prepare(generated.samples, batch)
        return self.prepare_pool.submit(lambda: (finish(), generated))

    def prepared(self, preparing: Future[tuple[Prepared, Generated]], step: int) -> Steps:
        with self.tm("wait_prev_prepare"):
            return preparing.result()
        yield

    def train(self, prepared: Prepared, step: int) -> Steps:
        with self.tm("train"):
            return self.run.learn(self.algorithm, prepared, step)
        yield


def drive(ports: RunPorts, schedule: str) -> dict[str, Any]:
    """Run ``schedule``'s loop (``schedules.loops.LOOPS``, the one the performance model runs) on the real roles to
    its end; the run's summary."""
    run_to_end(LOOPS[schedule](ports))
    return ports.run.finish(ports.roles, ports.last_step)
