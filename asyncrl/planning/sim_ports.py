"""The performance model's ``Ports`` for the loops of ``schedules.loops``: each phase priced on the virtual clock.

The rollout side is one worker generating the batches it is given in launch order, with the weights last pushed to
it; a sample's staleness is counted from those versions, as the real run counts it from the versions the engine
recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from asyncrl.planning.clock import Delay, Signal, Wait
from asyncrl.schedules.loops import Steps

Groups = list[tuple[int, tuple[int, ...]]]


@dataclass
class SimBatch:
    """A batch on the virtual clock: its groups (prompt length, response lengths), the weight version it was
    generated with, and (launched on the rollout side) the latch fired when its generation ends."""

    number: int
    groups: Groups
    version: int
    done: Signal | None = None

    @property
    def rows(self) -> int:
        return sum(len(rs) for _, rs in self.groups)


class SimPorts:
    """``sim``: the ``simulate.Sim`` whose clock, prices, work and books the ports use (not imported here: it
    imports this module)."""

    def __init__(self, sim: Any):
        self.sim = sim
        self.start, self.total = 1, sim.steps
        self.version = 0  # the trainer's weights (one update per step)
        self.pushed = 0  # the weights the rollout side holds
        self.last_done: Signal | None = None  # the rollout worker's last batch: the next one starts after it

    def steps(self) -> Iterator[int]:
        yield from range(self.start, self.total + 1)

    # ---- generation ----------------------------------------------------------------------------------------------
    def launch(self, batch: int) -> SimBatch:
        b = SimBatch(batch, self.sim.draw_batch(batch), self.pushed, Signal(f"generated{batch}"))
        self.sim.clock.spawn(self._rollout(b, self.last_done))
        self.last_done = b.done
        return b

    def _rollout(self, b: SimBatch, after: Signal | None) -> Steps[None]:
        if after is not None:
            yield Wait(after)
        yield from self.sim.generate("rollout", b.number, b.groups)
        self.sim.clock.fire(b.done)

    def generated(self, launched: SimBatch, batch: int) -> Steps[SimBatch]:
        assert launched.done is not None
        yield Wait(launched.done)
        return launched

    def generate(self, batch: int) -> Steps[SimBatch]:
        b = SimBatch(batch, self.sim.draw_batch(batch), self.version)
        yield from self.sim.generate("trainer", batch, b.groups)
        return b

    def push(self, step: int) -> Steps[None]:
        yield from self.sim.busy("sync", "sync_weights", step, Delay(self.sim.prices.sync_s))
        self.pushed = self.version

    # ---- preparation and update ----------------------------------------------------------------------------------
    def prepare(self, generated: SimBatch, step: int) -> Steps[SimBatch]:
        yield from self.sim.prepare("driver", step, generated.groups)
        return generated

    def start_preparing(self, generated: SimBatch, batch: int) -> tuple[SimBatch, Signal]:
        done = Signal(f"prepared{batch}")

        def on_thread() -> Steps[None]:
            yield from self.sim.prepare("driver-prepare", batch, generated.groups)
            self.sim.clock.fire(done)

        self.sim.clock.spawn(on_thread())
        return generated, done

    def prepared(self, preparing: tuple[SimBatch, Signal], step: int) -> Steps[tuple[SimBatch, SimBatch]]:
        batch, done = preparing
        yield Wait(done)
        return batch, batch

    def train(self, prepared: SimBatch, step: int) -> Steps[int]:
        yield from self.sim.train(step, prepared.groups)
        staleness = self.version - prepared.version
        self.version += 1
        return staleness

    def end_step(self, step: int, generated: SimBatch, prepared: SimBatch, trained: int) -> Steps[None]:
        self.sim.staleness[trained] += prepared.rows
        yield from self.sim.end_step(step, prepared.rows)
