"""The Rollouter's loop around its turns (``loop.produce``): what a park does with the rows in flight, in which order a
turn advances ranks and hands rows to their completion, and that an idle loop waits instead of turning.

The ranks are scripted engines (``test_fully_async_streaming.ScriptedEngine``, one decode step per turn) and the
driver's hold is a script the test writes, so what is checked is the loop's decisions, turn by turn, not a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from asyncrl.schedules.fully_async import loop
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.ranks import RankPorts
from asyncrl.types import Sample
from tests.test_fully_async_completion import HeldCompletions, books
from tests.test_fully_async_streaming import ScriptedEngine


@dataclass
class ScriptedPorts(RankPorts):
    """``loop.ProducePorts`` over scripted engines. ``script(turn)`` is the driver's hold as turn ``turn`` begins (the
    clock moves one step a hold); ``park`` records the clock and lets go at once; ``idle`` records the clock. The
    loop stops after ``turns`` holds."""

    script: Callable[[int], loop.Hold] = lambda _turn: loop.Hold()
    turns_max: int = 30
    clock: list[int] = field(default_factory=lambda: [0])
    parks: list[int] = field(default_factory=list)
    idles: list[int] = field(default_factory=list)
    tool_turns: int = 0

    def hold(self) -> loop.Hold:
        self.clock[0] += 1
        if self.clock[0] > self.turns_max:
            return loop.Hold(stop=True)
        return self.script(self.clock[0])

    def turns(self) -> int:
        return self.tool_turns

    def park(self):
        self.parks.append(self.clock[0])
        self.books.put_finished(0.0)
        yield from ()

    def idle(self):
        self.idles.append(self.clock[0])
        yield from ()


def run(ports: ScriptedPorts) -> None:
    for event in loop.produce(ports):
        raise AssertionError(f"the scripted ports' loop yielded {event!r}")


def setup(capacity: int, n: int, max_groups: int, length, complete=None) -> tuple[Producer, ScriptedEngine, list[int]]:
    clock = [0]
    return books([capacity], n, max_groups, clock, complete=complete), ScriptedEngine(capacity, length, clock), clock


def test_a_drain_admits_nothing_new_lets_every_row_end_and_parks_only_then():
    """Park without interrupt (no partial rollout) from turn 3: the rows already placed, those waiting in the engine's
    queue beyond its slots included, decode to their end; no group starts; the loop parks once, after the last."""
    p, engine, clock = setup(capacity=2, n=4, max_groups=2, length=lambda i: 3)
    ports = ScriptedPorts(p, [engine], script=lambda t: loop.Hold(park=t >= 3), turns_max=12, clock=clock)
    run(ports)
    assert p.counts["started_groups"] == 1  # group 0 only: admitted at turn 1; a second group never
    assert max(len(rows) for rows in engine.log.values()) == 2  # its four rows took the two slots two at a time
    assert sorted(engine.log) == [1, 2, 3, 4, 5, 6]  # rows 0-1 decode in turns 1-3, rows 2-3 in turns 4-6
    assert ports.parks and ports.parks[0] == 7  # parked the first hold after the last row ended
    assert p.rows_out() == 0 and not p.rows_waiting()
    [group] = p.queue.snapshot().groups
    assert len(group.samples) == 4 and all(len(s.response_ids) == 3 for s in group.samples)


def test_a_drain_places_the_rows_an_agent_hands_back_and_waits_for_its_tool_turns():
    """During a drain, a row whose completion hands it back (an agent's next turn) is placed again, not stranded, and
    a conversation whose tool call runs (``turns``) keeps the loop from parking."""
    handed: list[int] = []

    def tool_once(sample: Sample, done) -> None:
        if sample.row == 0 and not handed:
            handed.append(sample.row)
            done(replace(sample, response_ids=sample.response_ids + [9], stop_reason="interrupted", turns=1))
        else:
            done(sample)

    p, engine, clock = setup(capacity=2, n=2, max_groups=1, length=lambda i: 2, complete=tool_once)
    ports = ScriptedPorts(p, [engine], script=lambda t: loop.Hold(park=t >= 2), turns_max=8, clock=clock)
    run(ports)
    assert handed == [0]
    assert engine.log[3] == [0]  # the handed-back row decodes again during the drain
    [group] = p.queue.snapshot().groups
    assert [len(s.response_ids) for s in group.samples] == [2 + 1 + 1, 2]  # its turn, the tool's token, one more
    assert ports.parks[0] == 4

    p, engine, clock = setup(capacity=2, n=2, max_groups=1, length=lambda i: 2)
    ports = ScriptedPorts(p, [engine], script=lambda t: loop.Hold(park=True), turns_max=6, clock=clock)
    ports.tool_turns = 1  # a tool call runs somewhere: a drain may not park while it does
    run(ports)
    assert ports.parks == [] and ports.idles  # nothing to decode, nothing new to admit: the loop waits


def test_a_park_with_interrupt_takes_every_row_back_at_once_and_places_them_first_after():
    """Partial rollout: at the park every row comes back with its tokens; after the driver lets go they are placed
    before any new group, and continue from where they stopped."""
    p, engine, clock = setup(capacity=2, n=2, max_groups=2, length=lambda i: 4)
    script = lambda t: loop.Hold(park=t == 3, interrupt=t == 3)  # noqa: E731
    ports = ScriptedPorts(p, [engine], script=script, turns_max=8, clock=clock)
    run(ports)
    assert ports.parks == [3]  # at once: no drain
    assert 3 not in engine.log  # no decode step in the parked turn
    assert engine.log[4] == [0, 0]  # group 0's rows first, ahead of group 1 waiting for slots
    [first, *_] = p.queue.snapshot().groups
    assert first.index == 0 and all(len(s.response_ids) == 4 for s in first.samples)  # 2 before, 2 after


def test_every_rank_advances_before_any_row_goes_to_its_completion():
    """A turn's decode step is every rank's: the completions of the rows that ended see every rank's step done
    (the performance model prices a turn as the ranks' step in parallel, then the completions)."""
    clock = [0]
    seen: list[tuple[int, int, list[int]]] = []
    engines: list[ScriptedEngine] = []

    def complete(sample: Sample, done) -> None:
        seen.append((clock[0], sample.prompt.index, [max(e.log, default=0) for e in engines]))
        done(sample)

    p = books([1, 1], n=1, max_groups=2, clock=clock, complete=complete)
    engines.extend(ScriptedEngine(1, lambda i: 2, clock) for _ in range(2))
    ports = ScriptedPorts(p, engines, turns_max=2, clock=clock)
    run(ports)
    assert sorted(i for _, i, _ in seen) == [0, 1]  # one group a rank, both ended at turn 2
    assert all(steps == [2, 2] for _, _, steps in seen), seen


def test_an_idle_loop_waits_instead_of_turning_again():
    """Group 0's row ended and waits on its reward (held); no other group may start (one in flight at most) and no rank
    decodes: from then on the loop calls ``idle`` every turn."""
    held = HeldCompletions()
    p, engine, clock = setup(capacity=2, n=1, max_groups=1, length=lambda i: 2, complete=held)
    ports = ScriptedPorts(p, [engine], turns_max=6, clock=clock)
    run(ports)
    assert sorted(engine.log) == [1, 2] and len(held.waiting) == 1
    assert ports.idles == [3, 4, 5, 6]
