"""Rows complete one by one, off the decode: a row that ends goes to its completion (a reward, an agent's next move)
and the engine steps on; a group is queued when its last row's completion hands it back; slots are admitted by the
slot, not by the group.

The engines are scripted (``test_fully_async_streaming.ScriptedEngine``: a row's length is set by its prompt, one
decode step per turn); completions are held by the test and released when it says, so what is checked is the
producer's decisions, not a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from asyncrl.data.dataset import EpochSampler
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.queue import MessageQueue
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.types import Prompt, Sample
from tests.test_fully_async_streaming import ScriptedEngine, turn


class HeldCompletions:
    """A completion the test releases: rows wait here (as rewards in flight would) until ``release``."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Sample, Callable[[Sample], None]]] = []

    def __call__(self, sample: Sample, done: Callable[[Sample], None]) -> None:
        self.waiting.append((sample, done))

    def release(self, reward: float = 1.0, which: Callable[[Sample], bool] = lambda s: True) -> int:
        keep, go = [], []
        for sample, done in self.waiting:
            (go if which(sample) else keep).append((sample, done))
        self.waiting = keep
        for sample, done in go:
            sample.reward = reward
            done(sample)
        return len(go)


def books(capacities, n, max_groups, clock, complete=None, max_completing=None, staleness=10.0) -> Producer:
    budget = StalenessBudget(staleness_threshold=staleness)
    queue = MessageQueue(budget.groups_per_window_budget, "backpressure")
    sampler = EpochSampler(1000, 1, seed=0, shuffle=False)
    prompt = lambda _epoch, index: Prompt(index, [1, 2], "test", "")  # noqa: E731
    return Producer(
        budget,
        queue,
        sampler,
        prompt,
        n,
        capacities,
        max_groups,
        clock=lambda: clock[0],
        complete=complete,
        max_completing=max_completing,
    )


def run(producer: Producer, engines, clock, steps: int) -> None:
    for _ in range(steps):
        clock[0] += 1
        turn(producer, engines)


def test_a_group_waits_for_its_last_score_while_the_engine_decodes_new_groups():
    clock, held = [0], HeldCompletions()
    engine = ScriptedEngine(2, lambda i: 3, clock)
    p = books([2], n=2, max_groups=4, clock=clock, complete=held)
    run(p, [engine], clock, 3)  # group 0's two rows end at step 3
    assert len(held.waiting) == 2 and len(p.queue) == 0
    run(p, [engine], clock, 3)  # rewards still out: group 1 decodes in the freed slots meanwhile
    assert engine.log[4] == [1, 1] and len(p.queue) == 0
    assert p.rows_completing() == 4  # group 0's and group 1's rows, all waiting on their rewards
    held.release(which=lambda s: s.prompt.index == 0 and s.row == 0)
    run(p, [engine], clock, 1)
    assert len(p.queue) == 0  # one of its two scores is back
    held.release(which=lambda s: s.prompt.index == 0)
    run(p, [engine], clock, 1)
    [group] = p.queue.snapshot().groups
    assert group.index == 0 and [s.reward for s in group.samples] == [1.0, 1.0]


def test_rewards_in_flight_hold_admission_not_the_decode():
    clock, held = [0], HeldCompletions()
    engine = ScriptedEngine(4, lambda i: 2 if i < 2 else 50, clock)
    p = books([4], n=1, max_groups=8, clock=clock, complete=held, max_completing=2)
    run(p, [engine], clock, 2)  # prompts 0 and 1 end at step 2 and wait on their rewards
    assert p.rows_completing() == 2
    run(p, [engine], clock, 3)
    started = p.counts["started_groups"]
    assert started == 4  # no new group while two rewards are out: the two free slots stay empty
    assert engine.log[5] == [2, 3]  # the live rows decode on
    held.release()
    run(p, [engine], clock, 1)
    assert p.counts["started_groups"] == 6 and len(p.queue) == 2


def test_a_row_handed_back_to_decode_is_placed_again_while_its_siblings_still_decode():
    """An agent's tool turn: the completion returns the row "interrupted" with the tool's tokens appended; it goes
    back into a free slot at once, not after the group's other rows end."""
    clock = [0]
    turns: dict[tuple[int, int], int] = {}

    def tool_once(sample: Sample, done: Callable[[Sample], None]) -> None:
        key = (sample.prompt.index, sample.row)
        turns[key] = turns.get(key, 0) + 1
        if turns[key] == 1 and sample.row == 0:  # row 0's first turn ends in a tool call
            done(replace(sample, response_ids=sample.response_ids + [9, 9], stop_reason="interrupted", turns=1))
        else:
            done(sample)

    engine = ScriptedEngine(2, lambda i: 3, clock)
    engine.length = lambda i: 3
    p = books([2], n=2, max_groups=1, clock=clock, complete=tool_once)
    run(p, [engine], clock, 3)
    assert turns == {(0, 0): 1, (0, 1): 1}
    run(p, [engine], clock, 1)
    assert engine.log[4] == [0]  # row 0 is back in a slot at the next step, its sibling done meanwhile
    run(p, [engine], clock, 3)
    [group] = p.queue.snapshot().groups
    assert [len(s.response_ids) for s in group.samples] == [3 + 2 + 1, 3]  # its turn, the tool, one more token


def test_a_snapshot_keeps_rows_completing_and_a_restore_completes_them_again():
    from asyncrl.schedules.fully_async.recovery import Takeover

    clock, held = [0], HeldCompletions()
    engine = ScriptedEngine(2, lambda i: 2, clock)
    p = books([2], n=2, max_groups=1, clock=clock, complete=held)
    run(p, [engine], clock, 2)
    assert p.rows_completing() == 2
    snap = p.snapshot(0)
    assert [g.completing for g in snap.inflight] == [(0, 1)]
    held.release()  # the live books go on: the snapshot is a copy
    assert snap.inflight[0].completing == (0, 1)
    again = HeldCompletions()
    q = books([2], n=2, max_groups=1, clock=clock, complete=again)
    q.restore(Takeover(snap, [], 0))
    assert len(again.waiting) == 2 and q.rows_completing() == 2 and len(q.queue) == 0
    again.release(reward=0.5)
    turn(q, [ScriptedEngine(2, lambda i: 2, clock)])
    [group] = q.queue.snapshot().groups
    assert [s.reward for s in group.samples] == [0.5, 0.5]
    assert q.ledger.record(0, 0).queued == 1


class RowLengthEngine(ScriptedEngine):
    """A scripted engine whose rows end after ``length(prompt index, row)`` tokens: lengths differ within a group."""

    def advance(self) -> list[Sample]:
        while self.waiting and len(self.live) < self.capacity:
            self.live.append(self.waiting.pop(0))
        if not self.live:
            return []
        self.log[self.clock[0]] = [s.prompt.index for s in self.live]
        self.live = [replace(s, response_ids=s.response_ids + [7]) for s in self.live]
        ended = [s for s in self.live if len(s.response_ids) >= self.length(s.prompt.index, s.row)]
        self.live = [s for s in self.live if s not in ended]
        return [replace(s, stop_reason="eos") for s in ended]


def test_a_group_larger_than_the_free_slots_is_admitted_by_the_slot_and_keeps_every_slot_busy():
    """rollout.n = 16 on a 16-slot engine, row lengths 4-40 tokens within each group: a group enters as soon as one
    slot frees (its other rows wait in the engine's queue), so the slots stay busy; a rule that waits for 16 free
    slots at once leaves them idle while each group's longest row runs (about half the time here)."""
    clock, steps = [0], 600
    engine = RowLengthEngine(16, lambda i, row: 4 + (i * 31 + row * 7) % 37, clock)
    p = books([16], n=16, max_groups=16, clock=clock, staleness=100.0)  # the budget never binds here
    run(p, [engine], clock, steps)
    busy = sum(len(engine.log.get(t, [])) for t in range(1, steps + 1))
    assert busy / (16 * steps) >= 0.9, busy / (16 * steps)
    assert p.counts["started_groups"] > 20
    metrics = p.count_metrics()
    assert metrics["fully_async/slot_occupancy"] >= 0.9
