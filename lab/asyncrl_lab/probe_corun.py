"""How fast a trainer and a Rollouter move when they share a CPU machine's cores (fully_async and one_step_off on a
CPU box: the trainer on every core, the Rollouter on one more), against the prices the planner holds for them (the
sync run's update, the probe's decode: each alone, with OpenMP's default).

Two things differ in such a run. Its workers' idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=
PASSIVE``, ``asyncrl.workers.cluster.SHARED_CORES_ENV``: a spinning pool steals the other worker's core), which alone
makes a two-thread update slower: 205 ms against 118 ms on the bench's Intel machine (BENCHMARKS.md). And when their
threads outnumber the cores, time-slicing shares them: with the default policy an update beside a one-thread decode ran
12x slower (its threads spin at each barrier for the one sliced out), with the run's policy about as fast as alone. So
the probe times the run's update on its training threads and its streaming decode on one thread, in two processes: the
update alone with the default policy (``PRICED``), then each alone and both together with the run's (``SHARED``).
``shared_train``: the update's speed alone with the run's policy over its priced speed (applied to every run of several
pools); ``oversubscribed``: each job's speed together over alone, both with the run's policy (applied by the simulated
clock whenever its shared cores are oversubscribed, ``asyncrl.planning.clock.Clock(oversubscribed=...)``).

The decode's speed alone is not re-priced: on one thread it runs no OpenMP parallel region, so the policy has nothing
to act on. Timing it both ways measured only the two timings' noise (0.94-1.09 over twelve probes on one machine), and
pricing by that ratio moved fully_async's predictions by as much (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch

JOBS = ("train", "gen")  # the job of each of the two processes, by rank
PRICED = ("train",)  # the update alone, as the planner's prices were measured: ``rounds`` times
SHARED = ("train", "gen", "both")  # each job alone, then together, as a run of several pools runs them


def loop_calls(fn: Callable[[int], object], seconds: float) -> list[float]:
    """Seconds of each call of ``fn`` over about ``seconds`` (at least one call)."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    while not out or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn(0)
        out.append(time.perf_counter() - t0)
    return out


Job = Callable[[float], list[float]]  # runs for about that many seconds; the seconds of each of its calls
Jobs = Callable[[int], AbstractContextManager[Job]]  # a rank's job, ready while its block runs


def _worker(
    rank: int,
    jobs: Jobs,
    threads: list[int],
    seconds: float,
    rounds: int,
    barrier,
    out: str,
    phases: tuple[str, ...] = SHARED,
) -> None:
    torch.set_num_threads(threads[rank])
    mine = JOBS[rank]
    times: dict[str, list[float]] = {"alone": [], "together": []}
    with jobs(rank) as job:
        job(min(1.0, seconds))  # warm-up
        for _ in range(rounds):
            for phase in phases:
                barrier.wait()  # the other process blocks here while this one runs alone
                if phase == "both":
                    times["together"] += job(seconds)
                elif phase == mine:
                    times["alone"] += job(seconds)
        barrier.wait()
    Path(out, f"{rank}.json").write_text(json.dumps(times))


@dataclass(frozen=True)
class CorunRates:
    """Speeds over the planner's prices (see the module docstring): the update's alone in a run of several pools, and
    the update's and the decode's together over alone when they oversubscribe the cores."""

    shared_train: float
    oversubscribed_parallel: float
    oversubscribed_single: float


def _spawn(jobs: Jobs, train_threads: int, seconds: float, rounds: int, phases, env: dict[str, str | None]) -> list:
    """The call seconds of each job ``phases`` run (by rank, ``JOBS``), ``phases`` in turn, one process a job, started
    with ``env`` on top of this one's (None: the variable unset). The update alone (``PRICED``) starts no decode."""
    import torch.multiprocessing as mp

    procs = 2 if {"gen", "both"} & set(phases) else 1  # the update is rank 0
    saved = {k: os.environ.get(k) for k in env}
    _set_env(env)  # read by the children's OpenMP when it starts
    try:
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(procs)
        with tempfile.TemporaryDirectory() as d:
            args = (jobs, [train_threads, 1], seconds, rounds, barrier, d, phases)
            mp.spawn(_worker, args=args, nprocs=procs, join=True)
            return [json.loads(Path(d, f"{rank}.json").read_text()) for rank in range(procs)]
    finally:
        _set_env(saved)


def _set_env(env: dict[str, str | None]) -> None:
    """``env`` into this process's environment (None: the variable unset)."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def corun_rates(jobs: Jobs, train_threads: int, seconds: float = 3.0, rounds: int = 2) -> CorunRates:
    """``CorunRates`` from medians of the jobs' calls: ``rounds`` rounds of the update alone for ``seconds`` with
    OpenMP's default, then rounds of each alone and both together with the run's shared-core environment.
    ``jobs(0)`` builds the update's job (run on ``train_threads``), ``jobs(1)`` the decode's (on one thread), each in
    its own process and ready while its context is entered (``jobs`` is pickled to them: a module-level function or
    a partial of one)."""
    from asyncrl.workers.cluster import SHARED_CORES_ENV

    priced = _spawn(jobs, train_threads, seconds, rounds, PRICED, dict.fromkeys(SHARED_CORES_ENV))
    shared = _spawn(jobs, train_threads, seconds, rounds, SHARED, dict(SHARED_CORES_ENV))
    med = statistics.median
    together = [med(s["alone"]) / med(s["together"]) for s in shared]
    return CorunRates(med(priced[0]["alone"]) / med(shared[0]["alone"]), min(1.0, together[0]), min(1.0, together[1]))
