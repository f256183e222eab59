"""How fast a trainer and a Rollouter move when they share a CPU machine's cores and there are fewer cores than their
threads (fully_async and one_step_off on a CPU box: the trainer on every core, the Rollouter on one more).

Time-slicing does not share such cores fairly. A job on several threads (an update: parallel regions that end at a
barrier) waits at every barrier for its thread that was sliced out, while a one-thread job loses only its slices: on
the bench's 2-core machine an update on 2 threads beside a one-thread streaming decode ran at 0.16-0.29 of its speed
alone, the decode at 0.75 (BENCHMARKS.md, issue 49, eighth session), where a fair share gives both 2/3. So the probe
measures it: the run's update on the run's training threads and the run's streaming decode on one thread, in two
processes, each timed alone and together (``corun_rates``); the simulated clock moves a job on several threads at the
first rate and a one-thread job at the second whenever its shared cores are oversubscribed
(``clock.Clock(oversubscribed=...)``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

PHASES = ("train", "gen", "both")  # each job alone, then together; a round of them, ``rounds`` times


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


def _worker(
    rank: int, jobs: Callable[[int], Job], threads: list[int], seconds: float, rounds: int, barrier, out: str
) -> None:
    torch.set_num_threads(threads[rank])
    job = jobs(rank)
    job(min(1.0, seconds))  # warm-up
    mine = PHASES[rank]
    times: dict[str, list[float]] = {"alone": [], "together": []}
    for _ in range(rounds):
        for phase in PHASES:
            barrier.wait()  # the other process blocks here while this one runs alone
            if phase == "both":
                times["together"] += job(seconds)
            elif phase == mine:
                times["alone"] += job(seconds)
    barrier.wait()
    Path(out, f"{rank}.json").write_text(json.dumps(times))


def corun_rates(
    jobs: Callable[[int], Job], train_threads: int, seconds: float = 3.0, rounds: int = 2
) -> tuple[float, float]:
    """(the update's speed beside the decode, the decode's beside the update), each over its speed alone: medians of
    their calls over ``rounds`` rounds of each alone for ``seconds``, then both together. ``jobs(0)`` builds the
    update's job (run on ``train_threads``), ``jobs(1)`` the decode's (on one thread), each in its own process
    (``jobs`` is pickled to them: a module-level function or a partial of one)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    with tempfile.TemporaryDirectory() as d:
        args = (jobs, [train_threads, 1], seconds, rounds, barrier, d)
        mp.spawn(_worker, args=args, nprocs=2, join=True)
        got = [json.loads(Path(d, f"{rank}.json").read_text()) for rank in (0, 1)]
    rates = [statistics.median(g["alone"]) / statistics.median(g["together"]) for g in got]
    return min(1.0, rates[0]), min(1.0, rates[1])
