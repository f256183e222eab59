"""``schedules.loops.clock_step``: a real port's plain method as the clock step a loop runs with ``yield from``."""

from __future__ import annotations

import pytest

from asyncrl.schedules.loops import clock_step, run_to_end


class Counter:
    def __init__(self):
        self.calls: list[int] = []

    @clock_step
    def add(self, x: int) -> int:
        self.calls.append(x)
        return 2 * x


def test_a_clock_step_does_its_work_when_the_loop_steps_into_it_and_yields_nothing():
    c = Counter()
    step = c.add(3)
    assert c.calls == []  # nothing runs until a loop steps into it, as a simulated port's work
    got: list[int] = []

    def loop():
        got.append((yield from step))

    assert list(loop()) == []  # no clock event
    assert c.calls == [3] and got == [6]


def test_run_to_end_refuses_a_loop_that_yields_a_clock_event():
    def loop():
        yield "wait"

    with pytest.raises(RuntimeError, match="virtual clock"):
        run_to_end(loop())
