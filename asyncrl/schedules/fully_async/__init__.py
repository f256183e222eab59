"""``fully_async``: a Rollouter streams groups through a bounded queue; the roles learn from them as they come.

This module starts the run. ``loop`` holds the driver's loop (``consume``, over ``run_ports.StreamRunPorts`` here and
simulated ports in the planner) and the Rollouter's (``produce``, over the books of ``producer``); ``staleness``,
``queue`` and ``ledger`` are the protocol it keeps; ``recovery`` and ``supervisor`` replace a dead Rollouter. The
step, the staleness bound and the lossless resume: docs/schedules/fully_async.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from asyncrl.config import Config
from asyncrl.config.specs import TrainerPlan, default_old_policy
from asyncrl.schedules.fully_async.recovery import ROLLOUTER_STATE

if TYPE_CHECKING:  # imported where they are used, as in ``rollout_side``
    from asyncrl.algorithms import Algorithm
    from asyncrl.roles.clients import Roles, RolloutSide
    from asyncrl.run import Run
    from asyncrl.schedules.fully_async.supervisor import StreamSupervisor
    from asyncrl.weights.weight_sync import WeightSync

STOP_TIMEOUT_S = 60.0  # how long the clean-up waits for the Rollouter to stop before its worker is killed


def trainer_plan(cfg: Config) -> TrainerPlan:
    """A sync window of ``trigger_parameter_sync_step`` updates shares one weight version; with
    ``compute_prox_log_prob`` the ratio's denominator is the weights at the window's start (decoupled PPO)."""
    at = cfg.async_training
    old = "prox" if at.compute_prox_log_prob else default_old_policy(cfg)
    return TrainerPlan(old_policy=old, updates_per_version=at.trigger_parameter_sync_step)


def rollout_side() -> tuple[RolloutSide, type]:
    """On the stream, whose producer is the ``Rollouter``."""
    # imported here: the books (producer, staleness, queue, ledger) load without the engine and the run machinery,
    # so the performance model (asyncrl.planning) starts in a fraction of the time
    from asyncrl.roles.clients import RolloutSide
    from asyncrl.schedules.fully_async.rollouter import Rollouter

    return RolloutSide.STREAM, Rollouter


@contextmanager
def open_stream(cfg: Config) -> Iterator[tuple[Run, Algorithm]]:
    """``open_run`` for fully_async: the run (``run.stream``: its ``StreamSupervisor``, not started) and its
    algorithm; the Rollouter's generation thread is stopped at exit, whatever happened (in-process it would outlive
    the run otherwise)."""
    from asyncrl.schedules.fully_async.slots import budget_of  # imported here, as in ``rollout_side``
    from asyncrl.schedules.fully_async.supervisor import StreamSupervisor
    from asyncrl.schedules.run_ports import open_run

    at = cfg.async_training
    timeout = max(at.get_batch_timeout_s, at.pause_timeout_s)  # the longest a Rollouter call may take
    budget = budget_of(at, cfg.actor.ppo_mini_batch_size)

    def supervise(roles: Roles, sync: WeightSync, version: Callable[[], int]) -> StreamSupervisor:
        return StreamSupervisor(roles, sync, roles.respawn, version, cfg.trainer.max_worker_restarts, timeout, budget)

    with open_run(cfg, supervise) as (run, algorithm):
        try:
            yield run, algorithm
        finally:  # already failing, or the Rollouter dead: the backend kills it next
            with suppress(Exception):
                run.stream.rollouter.stop().result(timeout=STOP_TIMEOUT_S)


def run_fully_async(cfg: Config) -> dict[str, Any]:
    import torch

    from asyncrl.run.supervision import WorkerLostError
    from asyncrl.schedules.fully_async.loop import consume
    from asyncrl.schedules.fully_async.report import write_ledger_report
    from asyncrl.schedules.fully_async.run_ports import StreamRunPorts
    from asyncrl.schedules.loops import run_to_end

    with open_stream(cfg) as (run, algorithm):
        stream: StreamSupervisor = run.stream
        ports = StreamRunPorts(run, algorithm)
        try:
            resumed = run.dir.resumed_from
            stream.start(None if resumed is None else torch.load(resumed / ROLLOUTER_STATE, weights_only=False))
            run_to_end(consume(ports))
            if stream.lost is not None:  # lost in the last step, which finished
                raise stream.lost
            rollouter = stream.rollouter  # a replacement, if the first one died
            rollouter.stop().result()  # the books are final from here on
            counts = rollouter.take_metrics().result()
            summary = run.dir.summary
            summary["counts"] = {
                k.rsplit("/", 1)[1]: v for k, v in counts.items() if k.startswith("fully_async/count/")
            }
            summary["ledger"] = write_ledger_report(
                run.dir.path, len(run.prompts.train), rollouter.ledger_state().result()
            )
            return run.finish(ports.finished)
        except WorkerLostError:  # no Rollouter may be started again: keep the last finished step, losing nothing
            run.save_before_failing(ports.finished, None, extra_files={ROLLOUTER_STATE: stream.advanced()})
            raise
