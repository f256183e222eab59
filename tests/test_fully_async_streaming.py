"""The fully_async producer streams: a row that ends frees its slot at that step and a new group takes it at the next;
a finished group is queued at once, whatever older groups are doing (``loop.turn``, a turn of the loop the Rollouter
runs).

The engine here is scripted (every row's length is set by its prompt; one decode step per turn, the step count is the
clock): what is checked is the producer's decisions, step by step, not a model's output.
"""

from __future__ import annotations

from asyncrl.data.dataset import EpochSampler
from asyncrl.schedules.fully_async import loop
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.queue import MessageQueue
from asyncrl.schedules.fully_async.ranks import RankPorts
from asyncrl.schedules.fully_async.slots import stream_concurrency
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.types import Prompt, Sample


class ScriptedEngine:
    """A streaming engine whose rows end after ``length(prompt index)`` tokens; ``advance`` is one decode step."""

    def __init__(self, capacity: int, length, clock: list[int]):
        self.capacity, self.length, self.clock = capacity, length, clock
        self.waiting: list[Sample] = []
        self.live: list[Sample] = []
        self.log: dict[int, list[int]] = {}  # step -> prompt indices decoding in it

    def submit(self, rows: list[Sample]) -> None:
        self.waiting.extend(rows)

    def advance(self) -> list[Sample]:
        while self.waiting and len(self.live) < self.capacity:
            self.live.append(self.waiting.pop(0))
        if not self.live:
            return []
        step = self.clock[0]
        self.log[step] = [s.prompt.index for s in self.live]
        self.live = [_grow(s, step) for s in self.live]
        ended = [s for s in self.live if len(s.response_ids) >= self.length(s.prompt.index)]
        self.live = [s for s in self.live if s not in ended]
        return [_end(s) for s in ended]

    def holds_live_rows(self) -> bool:
        return bool(self.live or self.waiting)

    def request_interrupt(self) -> None:
        pass

    def interrupt(self) -> list[Sample]:
        back, self.live, self.waiting = self.live + self.waiting, [], []
        return back


def _grow(s: Sample, version: int) -> Sample:
    return Sample(s.prompt, s.response_ids + [7], s.logprobs + [-1.0], s.versions + [0], "interrupted",
                  s.start_version, row=s.row)  # fmt: skip


def _end(s: Sample) -> Sample:
    return Sample(s.prompt, s.response_ids, s.logprobs, s.versions, "eos", s.start_version, row=s.row)


def turn(books: Producer, ranks, put_timeout_s: float = 0.0, leave_put=lambda: True) -> bool:
    """One turn of the producer's loop (``loop.turn``) over in-process ranks: a generator that yields nothing."""
    step = loop.turn(RankPorts(books, ranks, put_timeout_s, leave_put))
    try:
        event = next(step)
    except StopIteration as done:
        return done.value
    raise AssertionError(f"a turn over in-process ranks yielded {event!r}")


def producer(capacities: list[int], n: int, max_groups: int, clock: list[int], staleness: float = 10.0, keep=None):
    budget = StalenessBudget(staleness_threshold=staleness)  # one group per update and per version
    queue = MessageQueue(budget.groups_per_window_budget, "backpressure")
    sampler = EpochSampler(1000, 1, seed=0, shuffle=False)
    prompt = lambda _epoch, index: Prompt(index, [1, 2], "test", "")  # noqa: E731
    return Producer(budget, queue, sampler, prompt, n, capacities, max_groups, clock=lambda: clock[0], keep=keep)


def test_a_short_row_frees_its_slot_at_once_and_its_group_is_queued_before_the_long_ones_end():
    """Capacity 4, n = 1, lengths [10, 1000, 1000, 1000], admission open: the short row ends at step 10, its group is
    queued before step 12, and a fifth row is decoding at step 11 (the batch decoder held its slot to step 1000)."""
    clock = [0]
    lengths = [10, 1000, 1000, 1000]
    engine = ScriptedEngine(4, lambda i: lengths[i] if i < len(lengths) else 1000, clock)
    books = producer([4], n=1, max_groups=8, clock=clock)
    queued_at: dict[int, int] = {}
    for step in range(1, 13):
        clock[0] = step
        turn(books, [engine])
        for g in books.queue.snapshot().groups:
            queued_at.setdefault(g.index, step)
    assert engine.log[1] == [0, 1, 2, 3]
    assert 0 in queued_at and queued_at[0] < 12, queued_at
    assert 4 in engine.log[11], engine.log[11]  # the fifth row, admitted into the freed slot
    assert len(engine.log[11]) == 4  # every slot busy
    assert books.counts["started_groups"] == 5


def test_groups_go_whole_to_the_least_loaded_rank_with_a_free_slot_and_no_slot_idles_while_rows_wait():
    clock = [0]
    ranks = [ScriptedEngine(4, lambda i: 3 + i % 5, clock), ScriptedEngine(2, lambda i: 3 + i % 5, clock)]
    capacities, max_groups = stream_concurrency(4, 2, 2, None)
    assert (capacities, max_groups) == ([4, 4], 8)
    books = producer([4, 2], n=2, max_groups=3, clock=clock)
    where: dict[int, set[int]] = {}
    for step in range(1, 40):
        clock[0] = step
        turn(books, ranks)
        # a group is admitted while its rank has a free slot: at most n - 1 rows beyond it wait in the engine
        assert books.load[0] <= 4 + 1 and books.load[1] <= 2 + 1
        for r, engine in enumerate(ranks):
            for i in engine.log.get(step, []):
                where.setdefault(i, set()).add(r)
        assert len(books.inflight) <= 3
    assert all(len(r) == 1 for r in where.values()), where  # a group's two rows on one rank
    assert {0, 1} <= set().union(*where.values())
    # enough finished that the trainer side can take them: nothing in flight is lost or doubled
    got = books.take(1, 0, timeout_s=0.0)
    assert got is not None and len(got.samples) == 2


def test_interrupted_rows_keep_their_tokens_and_are_placed_again_and_a_snapshot_waits_for_them():
    clock = [0]
    engine = ScriptedEngine(4, lambda i: 50, clock)
    books = producer([4], n=2, max_groups=2, clock=clock)
    for step in range(1, 6):
        clock[0] = step
        turn(books, [engine])
    assert books.rows_out() == 4
    try:
        books.snapshot(0)
        raise AssertionError("a snapshot with rows on an engine must be refused")
    except RuntimeError as e:
        assert "still on the engines" in str(e)
    RankPorts(books, [engine]).interrupt()
    assert books.rows_out() == 0 and books.counts["interrupted_rows"] == 4
    rows = [s for g in books.inflight.values() for s in g.samples]
    assert [len(s.response_ids) for s in rows] == [5, 5, 5, 5]
    snap = books.snapshot(0)
    assert len(snap.inflight) == 2
    placed = books.place()
    assert [len(r) for _, r in placed] == [4]  # the same rows again, no new group (max_groups = 2)
    assert all(len(s.response_ids) == 5 for _, rows in placed for s in rows)


def test_dynamic_sampling_drops_a_group_without_spread_and_frees_its_slot_at_once():
    clock = [0]
    engine = ScriptedEngine(2, lambda i: 2 if i % 2 == 0 else 4, clock)
    keep = lambda samples: samples[0].prompt.index % 2 == 1  # noqa: E731 - even prompts: no reward spread
    books = producer([2], n=1, max_groups=2, clock=clock, keep=keep)
    for step in range(1, 3):
        clock[0] = step
        turn(books, [engine])
    assert books.counts["filtered_groups"] == 1  # prompt 0 ended at step 2 and was dropped
    assert books.ledger.record(0, 0).filtered == 1
    clock[0] = 3
    turn(books, [engine])
    assert 2 in engine.log[3]  # its slot went to prompt 2 at the next step
    assert all(g.index % 2 == 1 for g in books.queue.snapshot().groups)


def test_a_due_group_behind_a_full_queue_is_taken_and_keeps_its_bound():
    """The exact rule with a queue of 1 group (below the window's budget of 3): the trainer at version 2 must take
    the slow group (start 0, staleness bound 2) before anything younger. While it waits, the generation thread must
    not sit in a blocked put behind the full queue (the slow row would never end); the slow group, finished with the
    queue still full, is taken from the books directly. The generation loop runs on its own thread, as in the
    Rollouter."""
    import threading
    import time

    clock, stop, errors = [0], [False], []
    engine = ScriptedEngine(3, lambda i: 60 if i == 0 else 1, clock)
    budget = StalenessBudget(staleness_threshold=2.0)  # B = W = 1, M = 3, S = 2
    sampler = EpochSampler(1000, 1, seed=0, shuffle=False)
    prompt = lambda _epoch, index: Prompt(index, [1, 2], "test", "")  # noqa: E731
    books = Producer(budget, MessageQueue(1, "backpressure"), sampler, prompt, 1, [3], 3, clock=lambda: clock[0])

    def generate():
        try:
            while not stop[0]:
                clock[0] += 1
                if not turn(books, [engine], 0.01, lambda: stop[0]):
                    time.sleep(0.001)
        except Exception as e:  # surfaced below
            errors.append(e)

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    try:
        taken = []
        for version in range(4):
            got = books.take(1, version, timeout_s=10.0)
            assert got is not None, f"no batch at version {version}: {books.counts}, queue {books.queue.ids()}"
            taken.append((got.groups[0].index, got.staleness[0]))
            books.on_sync(version + 1)
    finally:
        stop[0] = True
        thread.join(5)
    assert not errors, errors
    assert (0, 2) in taken[:3], taken  # the slow group, trained at its deadline at the latest
    assert all(s <= budget.max_staleness for _, s in taken), taken
