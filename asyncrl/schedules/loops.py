"""The order of events of ``sync``, ``one_step_off`` and ``two_step_off``, written once and run on two clocks.

Each loop is a generator over ``Ports``. The real run (``schedules.run_ports.RunPorts``) gives it ports that call
the roles; the performance model (``planning.sim_ports.SimPorts``) gives it ports that advance a virtual
clock. A port method that takes time is itself a generator, used as ``x = yield from ports.generated(...)``: the
real ports do the work and return without yielding, the simulated ones yield clock events. So a change to a loop
here changes what the run does and what the planner predicts together (``tests/test_perf.py`` checks that a changed
loop moves the prediction). ``fully_async``'s consumer loop is its own package's (``schedules.fully_async``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any, Protocol

Steps = Generator[Any, Any, Any]  # what a port method or a loop is: a generator a clock drives


class Ports(Protocol):
    """What a schedule loop does, and nothing of how: ``launch`` starts generating a batch on the rollout side (not
    waited for), ``generated`` waits for it, ``generate`` generates on the trainer's own engine, ``push`` sends the
    trainer's weights to the rollout side, ``prepare`` makes the algorithm's batch (``start_preparing`` /
    ``prepared``: on another thread), ``train`` updates, ``end_step`` logs, evaluates and saves."""

    start: int  # the first step this run takes (after a resume: the one after the checkpoint)
    total: int  # the last step

    def steps(self) -> Iterator[int]: ...

    def launch(self, batch: int) -> Any: ...

    def generated(self, launched: Any, batch: int) -> Steps: ...

    def generate(self, batch: int) -> Steps: ...

    def push(self, step: int) -> Steps: ...

    def prepare(self, generated: Any, step: int) -> Steps: ...

    def start_preparing(self, generated: Any, batch: int) -> Any: ...

    def prepared(self, preparing: Any, step: int) -> Steps: ...

    def train(self, prepared: Any, step: int) -> Steps: ...

    def end_step(self, step: int, generated: Any, prepared: Any, trained: Any) -> Steps: ...


def sync(p: Ports) -> Steps:
    """Generate with the current weights on the trainer, prepare, train: nothing overlaps."""
    for step in p.steps():
        generated = yield from p.generate(step)
        prepared = yield from p.prepare(generated, step)
        trained = yield from p.train(prepared, step)
        yield from p.end_step(step, generated, prepared, trained)


def one_step_off(p: Ports) -> Steps:
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


def two_step_off(p: Ports) -> Steps:
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


def run_to_end(loop: Steps) -> None:
    """Drive a loop over ports that never yield (the real run's): anything yielded is a port of the wrong clock."""
    for event in loop:
        raise RuntimeError(f"a real run's schedule loop yielded {event!r}: its ports belong to a virtual clock")
