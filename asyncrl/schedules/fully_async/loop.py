"""``fully_async``'s consumer loop, written once and run on two clocks (as ``schedules.loops`` is for the others).

The real run (``schedules.fully_async.run_fully_async``) drives it over ports that call the roles and the Rollouter;
the performance model (``planning.stream.StreamSimPorts``) over ports that advance a virtual clock, with the real
``Producer`` on it. A port method that takes time is a clock step (``schedules.loops.Steps``), used as
``x = yield from ports.take(step)``: the real ports' are plain methods made steps by ``loops.clock_step``, the
simulated ones yield clock events. A change here changes what the run does
and what the planner predicts together. The producer's side (``Producer.turn``) is shared the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, TypeVar

from asyncrl.schedules.loops import Steps

# what the loop carries between the ports (real: ``recovery.StreamBatch``, ``asyncrl.algorithms.Prepared``,
# ``Trained``): a step's groups taken from the queue, the batch prepared from them, what the update returned
B = TypeVar("B")
P = TypeVar("P")
T = TypeVar("T")


class StreamPorts(Protocol[B, P, T]):
    """What the driver of ``fully_async`` does: ``take`` a step's groups from the queue (waiting for them),
    ``prepare`` the algorithm's batch, ``train`` on it; when the update ended a sync window (``window_ended``), ``push``
    the new weights (park the Rollouter, interrupting its rows with partial rollout, send, resume it); ``end_step``
    logs, evaluates and saves."""

    def steps(self) -> Iterator[int]: ...

    def take(self, step: int) -> Steps[B]: ...

    def prepare(self, got: B, step: int) -> Steps[P]: ...

    def train(self, prepared: P, step: int) -> Steps[T]: ...

    def window_ended(self) -> bool: ...

    def push(self, step: int) -> Steps[None]: ...

    def end_step(self, step: int, got: B, prepared: P, trained: T) -> Steps[None]: ...


def consume(p: StreamPorts[B, P, T]) -> Steps[None]:
    """Per trainer step: take its groups (``Producer.take``), prepare, train; at the end of a sync window, push the
    weights."""
    for step in p.steps():
        got = yield from p.take(step)
        prepared = yield from p.prepare(got, step)
        trained = yield from p.train(prepared, step)
        if p.window_ended():
            yield from p.push(step)
        yield from p.end_step(step, got, prepared, trained)
