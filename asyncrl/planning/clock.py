"""A virtual clock on which processes (Python generators) compute, wait for each other and share cores.

A process yields what it does next:

- ``Compute(seconds, threads, pool)``: work that takes ``seconds`` with its ``threads`` to itself. In the shared pool
  (``Clock(cores=...)``) every running computation moves at ``min(1, cores / threads of all running)``; with
  ``oversubscribed=(parallel, single)`` (measured by ``asyncrl probe``), an oversubscribed pool running a computation
  on several threads moves those at ``parallel`` and the one-thread ones at ``single`` (a parallel region waits at its
  barrier for a thread sliced out). ``pool=None`` (a role's own devices) never slows.
- ``Wait(signal)``: until ``Clock.fire(signal)`` (at once if it fired since ``signal.fired`` was last reset).
- ``Delay(seconds)``: wall time that takes no core (a network transfer, a sleep).

``run`` hands each completion back to its process until every process ended or ``until`` says stop. Nothing here
knows about RL.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

Process = Generator[Any, Any, Any]


@dataclass
class Compute:
    seconds: float
    threads: float = 1.0
    pool: str | None = "shared"


@dataclass
class Delay:
    seconds: float


@dataclass
class Signal:
    """A latch: ``Clock.fire`` wakes every waiter, and ``fired`` stays set until the process that waits resets it."""

    name: str = ""
    fired: bool = False
    waiters: list[Process] = field(default_factory=list)


@dataclass
class Wait:
    signal: Signal


@dataclass
class _Job:
    proc: Process
    left: float  # seconds of work left at full speed (Compute) or of wall time (Delay)
    threads: float
    shared: bool


class Clock:
    def __init__(self, cores: float | None = None, oversubscribed: tuple[float, float] | None = None):
        self.cores = cores
        self.oversubscribed = oversubscribed
        self.now = 0.0
        self._ready: deque[Process] = deque()  # each resumed with None
        self._jobs: list[_Job] = []

    def spawn(self, proc: Process) -> None:
        self._ready.append(proc)

    def fire(self, signal: Signal) -> None:
        signal.fired = True
        waiters, signal.waiters = signal.waiters, []
        self._ready.extend(waiters)

    def _step(self, proc: Process) -> None:
        try:
            op = proc.send(None)
        except StopIteration:
            return
        if not isinstance(op, Compute | Delay | Wait):
            raise TypeError(f"Clock: a process yielded {op!r}; expected Compute, Delay or Wait")
        if isinstance(op, Wait) and not op.signal.fired:
            op.signal.waiters.append(proc)
        elif isinstance(op, Wait) or op.seconds <= 0:
            self._ready.append(proc)
        elif isinstance(op, Compute):
            self._jobs.append(_Job(proc, op.seconds, op.threads, op.pool == "shared" and self.cores is not None))
        else:
            self._jobs.append(_Job(proc, op.seconds, 0.0, False))

    def _rates(self) -> list[float]:
        shared = [j for j in self._jobs if j.shared]
        demand = sum(j.threads for j in shared)
        if self.cores is None or demand <= self.cores:
            return [1.0] * len(self._jobs)
        if self.oversubscribed is not None and any(j.threads > 1 for j in shared):
            parallel, single = self.oversubscribed
            return [(parallel if j.threads > 1 else single) if j.shared else 1.0 for j in self._jobs]
        return [self.cores / demand if j.shared else 1.0 for j in self._jobs]

    def run(self, until: Callable[[], bool] = lambda: False, max_events: int = 10_000_000) -> float:
        for _ in range(max_events):
            while self._ready:
                self._step(self._ready.popleft())
                if until():
                    return self.now
            if not self._jobs:
                return self.now
            rates = self._rates()
            dt = min(j.left / r for j, r in zip(self._jobs, rates))
            self.now += dt
            still: list[_Job] = []
            for j, r in zip(self._jobs, rates):
                j.left -= dt * r
                if j.left <= 1e-12:
                    self._ready.append(j.proc)
                else:
                    still.append(j)
            self._jobs = still
        raise RuntimeError(f"Clock.run: more than {max_events} events")
