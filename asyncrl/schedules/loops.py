"""The order of events of ``sync``, ``one_step_off`` and ``two_step_off``, written once and run on two clocks.

Each loop is a generator over ``Ports``: the real run's (``schedules.run_ports.RunPorts``, plain methods made clock
steps by ``clock_step``) or the performance model's (``planning.sim_ports.SimPorts``, generators of clock events), so
a change to a loop changes the run and the planner's prediction together (``tests/test_perf.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator
from typing import ParamSpec, Protocol, TypeVar

R = TypeVar("R")
Args = ParamSpec("Args")
# A clock step that ends with an ``R``: it yields what its clock takes (the planner's ``Compute``, ``Delay``,
# ``Wait``; nothing on the real run's) and is sent nothing back.
Steps = Generator[object, None, R]


def clock_step(method: Callable[Args, R]) -> Callable[Args, Steps[R]]:
    """A real port's method (it does its work when called and takes no virtual time) as the clock step a loop runs
    with ``yield from``: a generator that yields nothing and returns the method's value. The work runs when the loop
    steps into it, as a simulated port's does."""

    @functools.wraps(method)
    def step(*args: Args.args, **kwargs: Args.kwargs) -> Steps[R]:
        value = method(*args, **kwargs)
        yield from ()  # makes this a generator; it yields nothing
        return value

    return step


# What a loop carries between the ports, whatever they are (real: ``asyncrl.run.generation.Launched``, ``Generated``,
# ``asyncrl.algorithms.Prepared``, ``Trained``; simulated: ``planning.sim_ports.SimBatch``): a batch launched on the
# rollout side, a batch generated, one prepared, one being prepared on another thread, what an update returned.
L = TypeVar("L")
G = TypeVar("G")
P = TypeVar("P")
F = TypeVar("F")
T = TypeVar("T")


class Ports(Protocol[L, G, P, F, T]):
    """What a schedule loop does, and nothing of how: ``launch`` starts generating a batch on the rollout side (not
    waited for), ``generated`` waits for it, ``generate`` generates on the trainer's own engine, ``push`` sends the
    trainer's weights to the rollout side, ``prepare`` makes the algorithm's batch (``start_preparing`` /
    ``prepared``: on another thread), ``train`` updates, ``end_step`` logs, evaluates and saves."""

    start: int  # the first step this run takes (after a resume: the one after the checkpoint)
    total: int  # the last step

    def steps(self) -> Iterator[int]: ...

    def launch(self, batch: int) -> L: ...

    def generated(self, launched: L, batch: int) -> Steps[G]: ...

    def generate(self, batch: int) -> Steps[G]: ...

    def push(self, step: int) -> Steps[None]: ...

    def prepare(self, generated: G, step: int) -> Steps[P]: ...

    def start_preparing(self, generated: G, batch: int) -> F: ...

    def prepared(self, preparing: F, step: int) -> Steps[tuple[P, G]]: ...

    def train(self, prepared: P, step: int) -> Steps[T]: ...

    def end_step(self, step: int, generated: G, prepared: P, trained: T) -> Steps[None]: ...


def sync(p: Ports[L, G, P, F, T]) -> Steps[None]:
    """Generate with the current weights on the trainer, prepare, train: nothing overlaps."""
    for step in p.steps():
        generated = yield from p.generate(step)
        prepared = yield from p.prepare(generated, step)
        trained = yield from p.train(prepared, step)
        yield from p.end_step(step, generated, prepared, trained)


def one_step_off(p: Ports[L, G, P, F, T]) -> Steps[None]:
    """Batch t+1 is generated (with the weights before update t) while batch t is prepared and trained."""
    launched = p.launch(p.start)
    for step in p.steps():
        generated = yield from p.generated(launched, step)
        yield from p.push(step)
        if step < p.total:
            launched = p.launch(step + 1)
        prepared = yield from p.prepare(generated, step)
        trained = yield from p.train(prepared, step)
        yield from p.end_step(step, generated, prepared, trained)


def two_step_off(p: Ports[L, G, P, F, T]) -> Steps[None]:
    """Batch t+2 is generated and batch t+1 prepared (on another thread) while batch t is trained."""
    first = yield from p.generated(p.launch(p.start), p.start)
    preparing = p.start_preparing(first, p.start)
    launched = p.launch(p.start + 1) if p.start < p.total else None
    for step in p.steps():
        prepared, generated = yield from p.prepared(preparing, step)
        if launched is not None:  # batch step+1 is generated: prepare it while this step trains
            following = yield from p.generated(launched, step + 1)
            yield from p.push(step)
            launched = p.launch(step + 2) if step + 2 <= p.total else None
            preparing = p.start_preparing(following, step + 1)
        trained = yield from p.train(prepared, step)
        yield from p.end_step(step, generated, prepared, trained)


LOOPS = {"sync": sync, "one_step_off": one_step_off, "two_step_off": two_step_off}


def run_to_end(loop: Steps[None]) -> None:
    """Drive a loop over ports that never yield (the real run's): anything yielded is a port of the wrong clock."""
    for event in loop:
        raise RuntimeError(f"a real run's schedule loop yielded {event!r}: its ports belong to a virtual clock")
