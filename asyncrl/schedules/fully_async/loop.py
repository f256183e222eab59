"""``fully_async``'s two loops, each written once and run on two clocks (as ``schedules.loops`` is for the others).

``consume`` is the driver's: over ``run_ports.StreamRunPorts`` in a run, ``planning.stream.StreamSimPorts`` in the
performance model. ``produce`` is the Rollouter's: over ``rollouter.RollouterPorts`` on its generation thread,
``planning.stream.SimRollouter``'s ranks priced on the clock in the model, both with the real ``Producer``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.loops import Steps
from asyncrl.types import Sample

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


@dataclass
class Hold:
    """The driver's hold on the producer's loop: ``park`` it (a weight sync, a checkpoint), with ``interrupt`` taking
    every row back from the ranks first (partial rollout), else letting the live rows end; ``stop`` it for good.
    ``parked``: the loop waits at its park point."""

    park: bool = False
    interrupt: bool = False
    stop: bool = False
    parked: bool = False


class TurnPorts(Protocol):
    """The ranks a ``turn`` drives: ``submit`` rows to a rank (they enter at its next step), ``advance`` every rank
    (the rows that ended, per rank), ``decoding`` (a rank decodes on the loop's own clock: turn again at once);
    ``put`` the finished groups in the queue (whether any went)."""

    books: Producer

    def submit(self, rank: int, rows: list[Sample]) -> None: ...
    def advance(self) -> Steps[list[list[Sample]]]: ...
    def decoding(self) -> bool: ...
    def put(self) -> bool: ...


class ProducePorts(TurnPorts, Protocol):
    """And around the turns: the driver's ``hold`` as a turn begins (what wakes an idle loop counts from there),
    agent ``turns`` whose tool call runs (a drain waits for them), ``interrupt`` every rank (their rows back to their
    groups, partial), ``park`` (queue what finished, tell the driver, wait until it lets go), ``idle`` (nothing moved:
    wait until something may have)."""

    def hold(self) -> Hold: ...
    def turns(self) -> int: ...
    def interrupt(self) -> None: ...
    def park(self) -> Steps[None]: ...
    def idle(self) -> Steps[None]: ...


def produce(p: ProducePorts) -> Steps[None]:
    """The Rollouter's loop until the driver stops it. A park interrupts every rank first (partial rollout), or
    drains: no new group is placed and the live rows, and the conversations whose tool call runs, go on to their
    end; then the loop waits, parked, until the driver lets go. Otherwise a ``turn``; nothing moved: ``idle``."""
    books = p.books
    while not (hold := p.hold()).stop:
        if hold.park:
            if hold.interrupt:
                p.interrupt()
            if hold.interrupt or not (books.rows_out() or books.rows_waiting() or p.turns()):
                yield from p.park()
                continue
        if not (yield from turn(p, admit=not hold.park)):
            yield from p.idle()


def turn(p: TurnPorts, admit: bool = True) -> Steps[bool]:
    """One turn: place rows on the ranks (new groups only with ``admit``; else only the rows of groups in flight: an
    agent's next turn), advance every rank, hand the rows that ended to their completion, queue the groups whose last
    row completed. Returns whether to turn again at once (something moved, or a rank decodes on the loop's clock)."""
    for rank, rows in p.books.place(admit):
        p.submit(rank, rows)
    ended = yield from p.advance()
    for rank, rows in enumerate(ended):
        if rows:
            p.books.returned(rank, rows)
    return p.put() or any(ended) or p.decoding()
