"""The real run: ``open_run`` builds it whole before a schedule's first step, and ``RunPorts`` are the ports the
loops of ``schedules.loops`` run on, the roles' calls, each phase timed.

What a step measures (``timing_s/*``, the sync's metrics) is here once for the three schedules; how it ends (metrics ->
evaluation -> log -> checkpoint) is ``Run.end_step``, fully_async's too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from typing import Any

import torch

from asyncrl.algorithms import Algorithm, Prepared, Trained, algorithm_class
from asyncrl.comm.transport import transport_of
from asyncrl.config import Config
from asyncrl.models.loading import check_model_dir
from asyncrl.models.loading import load_tokenizer_from as load_tokenizer
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.roles.clients import Roles, RolloutSide
from asyncrl.rollout.agent.loop import check_agent_loop
from asyncrl.run import Run
from asyncrl.run.directory import RunDir
from asyncrl.run.generation import BatchFiller, Generated, Launched, PromptStream, Replayed, launch_generation
from asyncrl.run.skip import RolloutSkip
from asyncrl.run.step_log import StepLog, StepTimer
from asyncrl.run.supervision import RolloutPool, WorkerLostError
from asyncrl.schedules import schedule_module, specs_for
from asyncrl.schedules.loops import LOOPS, clock_step, run_to_end
from asyncrl.weights.weight_sync import WeightSync
from asyncrl.workers.start import start_roles

# fully_async's: who keeps its Rollouter alive, built from the roles, the weight sync and the trainer's version
StreamFactory = Callable[[Roles, WeightSync, Callable[[], int]], Any]


@contextmanager
def _driver_threads(cfg: Config) -> Iterator[None]:
    """With the Ray backend the driver only keeps books (collate, advantages) beside workers that use every core:
    one torch thread, so its OpenMP pool does not wake a second thread on (and spin on) a core a worker is using."""
    if cfg.trainer.backend != "ray":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def open_run(cfg: Config, stream: StreamFactory | None = None) -> Iterator[tuple[Run, Algorithm]]:
    """The ``Run``, built whole before a schedule's first step (``stream`` builds fully_async's Rollouter supervisor),
    and its algorithm. Everything started here is stopped at exit, the metrics log too (its trackers' runs marked
    failed when the run raised)."""
    check_model_dir(cfg.model.path)  # before any worker starts: the workers load the weights
    check_agent_loop(cfg.rollout.agent.default_agent_loop)
    directory = RunDir(cfg)
    tokenizer = load_tokenizer(cfg.model.path)
    prompts = PromptStream(cfg, tokenizer)
    reward_fn = build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize)  # evaluation
    cls, specs = algorithm_class(cfg), specs_for(cfg)
    side, producer = schedule_module(cfg).rollout_side()
    with (
        _driver_threads(cfg),
        cls.resources(cfg, tokenizer, str(directory.path)) as resources,
        start_roles(cfg, side, specs, cls.roles_needed(cfg), producer) as roles,
    ):
        algorithm = cls(cfg, tokenizer, roles, resources)
        progress, cursor = directory.resume(roles.checkpointed)
        if cursor is not None:
            prompts.sampler.load_state_dict(cursor)
        algorithm.on_resume(progress.start_step)
        directory.summary.update(algorithm.summary)
        rendezvous = dict(roles.rendezvous)
        sync = pool = supervisor = None
        if side is not RolloutSide.ACTOR:  # the sync group, and the rollout side brought to the trainer's weights
            ready = cfg.trainer.role_start_timeout_s
            backend = transport_of([h.location(ready) for h in [roles.trainer.handle, *roles.receivers]])
            sync = WeightSync(roles.trainer.handle, roles.receivers, cfg.weight_sync, ready, backend=backend)
            sync.setup()
            sync.push(progress.version)  # after a resume: the checkpoint's
            rendezvous["weight_sync"] = sync.endpoint or ""
            directory.summary.update(sync.summary())
            version = lambda: progress.version  # noqa: E731 - read at each replacement
            if stream is not None:
                supervisor = stream(roles, sync, version)
            elif roles.respawn is not None and roles.rollouter is None:
                pool = RolloutPool(
                    roles, sync, roles.respawn, version, cfg.trainer.max_worker_restarts, cfg.rollout.generate_timeout_s
                )
        directory.summary["placement"] = {
            "pools": {name: asdict(p) for name, p in roles.placement.all_pools().items()},
            "roles": roles.placement.roles,
            "workers": [asdict(w) for w in roles.locations(cfg.trainer.role_start_timeout_s)],
            "rendezvous": rendezvous,
        }
        resumed = directory.resumed_from is not None
        log = StepLog(cfg, directory.path, tokenizer, directory.summary["placement"], resumed)
        failed = True  # until the block ends normally: the trackers' runs marked failed; a resume continues them
        try:
            run = Run(cfg, directory, prompts, progress, log, roles, reward_fn, sync, pool, supervisor)
            run.evaluate_before_training()
            yield run, algorithm
            failed = False
        finally:
            log.close(failed)


class TrainPort:
    """The train port of every schedule's real ports (``RunPorts`` and fully_async's ``StreamRunPorts``): the
    actor's update (``Algorithm.train``), timed, with the run's books on either side of it."""

    run: Run
    algorithm: Algorithm
    tm: StepTimer

    @clock_step
    def train(self, prepared: Prepared, step: int) -> Trained:
        with self.tm("train"):
            self.run.consuming(prepared.samples, step)
            trained = self.algorithm.train(prepared, step)
        self.run.trained(trained, len(prepared.samples), step)
        return trained


class RunPorts(TrainPort):
    """The run's weight ``sync`` set (a rollout pool): the schedule generates there (else on the trainer's own
    engine). ``prepare_pool``: the thread ``start_preparing`` finishes a batch's preparation on (two_step_off).
    The data cursor a checkpoint records is the one after the last batch this step trained: batches drawn beyond it
    (in flight) are drawn and generated again by a resumed run, neither lost nor repeated."""

    def __init__(self, run: Run, algorithm: Algorithm, prepare_pool: ThreadPoolExecutor):
        self.run, self.algorithm, self.sync = run, algorithm, run.sync
        self.prepare_pool = prepare_pool
        self.filler, self.params = BatchFiller(run.cfg), run.prompts.sampling()
        self.skip = RolloutSkip(run.cfg) if run.cfg.rollout.skip.enable else None  # dump batches, or read them back
        self.start, self.total = run.start_step, run.cfg.trainer.total_training_steps
        self.last_step = run.start_step - 1
        self.cursors: dict[int, dict] = {run.start_step - 1: run.prompts.sampler.state_dict()}  # batch b -> after it
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

    @clock_step
    def end_step(self, step: int, generated: Generated, prepared: Prepared, trained: Trained) -> None:
        self._timing.close()
        # on the pool: measured on the rollout workers, overlapped with the step before
        last = {"timing_s/gen": generated.seconds} if self.sync is not None else None
        parts = (self.sync_metrics, generated.metrics)
        self.run.end_step(step, prepared, trained, self.tm, *parts, last=last, sampler_state=self.cursors[step])
        for b in [b for b in self.cursors if b < step]:
            del self.cursors[b]

    # ---- generation ----------------------------------------------------------------------------------------------
    def launch(self, batch: int, gen_batch: int = 1) -> Launched | Replayed:
        """Batch ``batch``'s ``gen_batch``-th generation batch (dynamic sampling's extra ones: drawn before the next
        batch's first), on the pool or the trainer's engine; not waited for."""
        run = self.run
        prompts = run.prompts.next_prompts()
        self.cursors[batch] = run.prompts.sampler.state_dict()
        seed, rollouts = run.prompts.gen_seed(), run.roles.rollouts
        generate = lambda: launch_generation(rollouts, prompts, self.params, seed, batch, run.pool)  # noqa: E731
        if self.skip is None:
            return generate()
        return self.skip.launch(prompts, batch, generate, gen_batch=gen_batch)

    def _fill(self, launched: Launched | Replayed, batch: int) -> Generated:
        return self.filler.fill(batch, launched, lambda g: self.launch(batch, g))

    @clock_step
    def generate(self, batch: int) -> Generated:
        with self.tm("gen"):
            return self._fill(self.launch(batch), batch)

    @clock_step
    def generated(self, launched: Launched | Replayed, batch: int) -> Generated:
        with self._checkpoint_if_lost(), self.tm("wait_prev_gen"):
            return self._fill(launched, batch)

    @clock_step
    def push(self, step: int) -> None:
        assert self.sync is not None
        with self._checkpoint_if_lost(), self.tm("sync_rollout_weights"):
            self.sync_metrics = self.sync.metrics((self.run.pool or self.sync).push(self.run.version))

    @contextmanager
    def _checkpoint_if_lost(self) -> Iterator[None]:
        """The pool replaces a rollout worker that died; one it could not replace (past its budget) stops the run
        after a checkpoint of the last finished step."""
        try:
            yield
        except WorkerLostError:
            self.run.save_before_failing(self.last_step, self.cursors.get(self.last_step))
            raise

    # ---- preparation and update ----------------------------------------------------------------------------------
    @clock_step
    def prepare(self, generated: Generated, step: int) -> Prepared:
        with self.tm("prepare"):
            return self.algorithm.prepare(generated.samples, step)()

    def start_preparing(self, generated: Generated, batch: int) -> Future[tuple[Prepared, Generated]]:
        """Issued here, in batch order; finished on the preparation thread."""
        finish = self.algorithm.prepare(generated.samples, batch)
        return self.prepare_pool.submit(lambda: (finish(), generated))

    @clock_step
    def prepared(self, preparing: Future[tuple[Prepared, Generated]], step: int) -> tuple[Prepared, Generated]:
        with self.tm("wait_prev_prepare"):
            return preparing.result()


def drive(cfg: Config) -> dict[str, Any]:
    """Run ``trainer.schedule``'s loop (``schedules.loops.LOOPS``, the one the performance model runs) on the real
    roles to its end; the run's summary. The pool's thread is two_step_off's preparation thread (unused otherwise)."""
    with open_run(cfg) as (run, algorithm), ThreadPoolExecutor(1, "prepare") as pool:
        ports = RunPorts(run, algorithm, pool)
        run_to_end(LOOPS[cfg.trainer.schedule](ports))
        return run.finish(ports.last_step)
