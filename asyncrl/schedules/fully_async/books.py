"""The ``fully_async`` producer's books (``Books``) and the driver's side of them: a trainer step's ``take``, the
``snapshot`` a checkpoint keeps and its ``restore``, the counters. ``producer.Producer`` adds the loop that fills them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from asyncrl.data.dataset import EpochSampler
from asyncrl.schedules.fully_async.ledger import PromptLedger
from asyncrl.schedules.fully_async.queue import Group, MessageQueue, QueueClosed
from asyncrl.schedules.fully_async.recovery import InFlightGroup, RollouterSnapshot, StreamBatch, Takeover, advance
from asyncrl.schedules.fully_async.slots import Occupancy
from asyncrl.schedules.fully_async.staleness import StalenessBudget, StalenessController
from asyncrl.types import Prompt, Sample

POLL_S = 0.02  # how often an idle generation thread re-checks admission and the queue, seconds
# fully_async/count/<key>: every group admitted ends up consumed, dropped, filtered, queued or in flight
COUNT_KEYS = (
    "started_groups",
    "queued_groups",
    "consumed_groups",
    "dropped_groups",
    "dropped_stale_samples",
    "interrupted_rows",
    "filtered_groups",
)


class Books:
    """The books a ``Producer``'s loop keeps, guarded by ``lock`` (the generation thread, completions' threads and
    the driver's calls share them). ``keep(samples)`` (dynamic sampling) says whether a scored group goes to the
    queue; None keeps every group; ``complete(row, done)`` is a row's completion (None: done as it ended)."""

    def __init__(
        self,
        budget: StalenessBudget,
        queue: MessageQueue,
        sampler: EpochSampler,
        prompt_of: Callable[[int, int], Prompt],
        n: int,
        capacities: Sequence[int],
        max_groups: int,
        clock: Callable[[], float] = time.time,
        keep: Callable[[list[Sample]], bool] | None = None,
        complete: Callable[[Sample, Callable[[Sample], None]], None] | None = None,
        max_completing: int | None = None,
    ):
        if not capacities or min(capacities) < 1:
            raise ValueError(f"Producer: every rank needs a capacity >= 1 row (got {list(capacities)})")
        self.budget, self.queue, self.sampler, self.prompt_of = budget, queue, sampler, prompt_of
        self.n, self.max_groups, self.clock, self.keep = n, max_groups, clock, keep
        # no completion: a row is done as the engine ended it (the performance model prices rewards itself)
        self.complete = complete or (lambda sample, done: done(sample))
        self.max_completing = max_completing
        self.capacities = list(capacities)
        self.controller = StalenessController(budget)
        self.ledger = PromptLedger()
        self.inflight: dict[str, InFlightGroup] = {}  # insertion order = start order
        self.processing_s: dict[str, float] = {}  # queued group -> seconds from admission to the queue
        self.counts: Counter[str] = Counter(dict.fromkeys(COUNT_KEYS, 0))
        self.skip: set[tuple[int, int]] = set()  # prompts a dead predecessor issued and the trainer consumed
        self.lock = threading.Lock()  # the books, shared by the generation thread and the driver's calls
        # where rows are: (prompt uid, row) -> (group id, rank) for every row on an engine; rows held per rank
        self.placed: dict[tuple[str, int], tuple[str, int]] = {}
        self.load = [0] * len(self.capacities)
        # rows that ended and wait for their completion: (prompt uid, row) -> group id; rows completing per group
        self.completing: dict[tuple[str, int], str] = {}
        self._pending: Counter[str] = Counter()
        self.wake = threading.Event()  # set when a completion hands a row back: the generation thread looks again
        self._finished_at: dict[str, float] = {}  # finished group -> when its last row ended
        # indexes over ``inflight`` (the loop runs once per decode step: no scan of every group in flight), each
        # group id -> its start order: groups with unfinished rows on no engine, and finished groups not yet queued
        self._order: dict[str, int] = {}
        self._unplaced: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._out: Counter[str] = Counter()  # group id -> its rows on an engine
        self._occupancy = Occupancy(self.capacities, clock)
        self._wait = [0.0, 0]  # seconds finished groups waited for the queue, groups, since ``count_metrics``
        self._admitted = [0, 0]  # groups admitted in the last whole version, and in the current one
        self.taker_waiting = False  # the trainer's last look found no batch it may take (``take``)

    def _waiting(self, g: InFlightGroup) -> list[Sample]:
        """Rows of ``g`` left to decode that are on no engine and not completing."""
        busy = self.placed, self.completing
        return [s for s in g.samples if s.stop_reason == "interrupted" and all((s.uid, s.row) not in b for b in busy)]

    def _queued(self, group: InFlightGroup, dropped: tuple[str, ...]) -> None:
        gid = group.group_id
        self.controller.on_queued(gid)
        del self.inflight[gid], self._order[gid], self._done[gid]
        self.ledger.queued(gid)
        now = self.clock()
        self.processing_s[gid] = now - group.started_at
        finished_at = self._finished_at.pop(gid, None)
        if finished_at is not None:  # None: finished before a restore
            self._wait[0] += now - finished_at
            self._wait[1] += 1
        self.counts["queued_groups"] += 1
        if dropped:
            self.controller.on_dropped(dropped)
            self.ledger.dropped(dropped)
            self.counts["dropped_groups"] += len(dropped)
            self.counts["dropped_stale_samples"] += len(dropped) * self.n
            for d in dropped:
                self.processing_s.pop(d, None)

    # ---- the driver's side -----------------------------------------------------------------------------------------
    def take(self, n_groups: int, trainer_version: int, timeout_s: float) -> StreamBatch | None:
        """The ``n_groups`` groups of one trainer step at ``trainer_version``, with their staleness: the ones
        ``StalenessController.pick`` chooses among the queued groups and the finished ones not queued yet (so a full
        queue never holds a due group out); None if no choice is possible within ``timeout_s`` (0: one look)."""
        if n_groups != self.budget.groups_per_update:
            raise ValueError(f"Producer.take: a step takes {self.budget.groups_per_update} groups (got {n_groups})")
        until = time.monotonic() + timeout_s
        while True:
            with self.lock:
                got = self._take_now(trainer_version)
                self.taker_waiting = got is None
                if got is not None:
                    self.wake.set()  # consumption frees admission
                    return got
                if self.queue.closed:
                    raise QueueClosed(f"Producer.take: the queue is closed ({len(self.queue)} groups queued)")
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.queue.wait(min(POLL_S, left))

    def _take_now(self, trainer_version: int) -> StreamBatch | None:
        queued = self.queue.snapshot().groups
        done = [self.inflight[g] for g in sorted(self._done, key=self._done.__getitem__)]
        candidates = [(g.group_id, g.start_version) for g in (*queued, *done)]
        chosen = self.controller.pick(candidates, trainer_version)
        if chosen is None:
            return None
        got = {g.group_id: g for g in self.queue.take([candidates[k][0] for k in chosen if k < len(queued)])}
        for k in chosen:
            if k >= len(queued):  # finished, not queued yet: queued and consumed in one step
                group = done[k - len(queued)]
                self._queued(group, ())
                got[group.group_id] = queued_form(group)
        ids = [candidates[k][0] for k in chosen]
        staleness = self.controller.on_consumed(ids, trainer_version)
        self.ledger.consumed(ids)
        proc = [self.processing_s.pop(g, 0.0) for g in ids]
        self.counts["consumed_groups"] += len(ids)
        return StreamBatch([got[g] for g in ids], staleness, proc)

    def on_sync(self, version: int) -> None:
        """New groups start with ``version`` from now on (the engines hold its weights)."""
        with self.lock:
            if version != self.controller.version:
                self._admitted = [self._admitted[1], 0]
        self.controller.on_sync(version)

    def snapshot(self, engine_version: int) -> RollouterSnapshot:
        with self.lock:
            if self.placed:
                raise RuntimeError(f"Producer.snapshot: {len(self.placed)} rows are still on the engines")
            return RollouterSnapshot(
                queue=self.queue.snapshot(),
                inflight=[self._copy(g) for g in self.inflight.values()],
                controller=self.controller.state_dict(),
                ledger=self.ledger.state_dict(),
                sampler=self.sampler.state_dict(),
                processing_s=dict(self.processing_s),
                counts=dict(self.counts),
                engine_version=engine_version,
                skip=tuple(sorted(self.skip)),
            )

    def _copy(self, g: InFlightGroup) -> InFlightGroup:
        """``g`` as it is now (completions go on changing the live one), with its rows that are completing."""
        rows = tuple(s.row for s in g.samples if (s.uid, s.row) in self.completing)
        return replace(g, samples=list(g.samples), completing=rows)

    def restore(self, take: Takeover) -> None:
        """Load a snapshot, with a takeover's consumption replayed on top (``recovery``), continuing at the
        takeover's version. Rows that were completing go to their completion again."""
        state = advance(take, self.budget) if take.consumed else take.snapshot
        self.controller.load_state_dict(state.controller)
        self.controller.on_sync(take.version)
        self.ledger.load_state_dict(state.ledger)
        self.skip = set(state.skip)
        self.queue.restore(state.queue)
        self.sampler.load_state_dict(state.sampler)
        self.inflight = {g.group_id: replace(g, completing=()) for g in state.inflight}
        self._order = {gid: k for k, gid in enumerate(self.inflight)}
        again = [(g.group_id, g.samples[r]) for g in state.inflight for r in g.completing]
        self.completing = {(s.uid, s.row): gid for gid, s in again}
        self._out, self._pending = Counter(), Counter(gid for gid, _ in again)
        self._unplaced = {gid: self._order[gid] for gid, g in self.inflight.items() if self._waiting(g)}
        settled = [gid for gid, g in self.inflight.items() if g.finished and gid not in self._pending]
        self._done = {gid: self._order[gid] for gid in settled}
        self.processing_s = dict(state.processing_s)
        self.counts = Counter(dict.fromkeys(COUNT_KEYS, 0))
        self.counts.update({k: v for k, v in state.counts.items() if k in COUNT_KEYS})  # an older run's, renamed
        self.placed, self.load = {}, [0] * len(self.capacities)
        for _, sample in again:
            self.complete(sample, self.completed)

    def count_metrics(self) -> dict[str, float]:
        """Counters and gauges since the last call: slot occupancy (rows on each rank's engine over its slots,
        time-averaged), the seconds a finished group waited for the queue, the groups admitted per version."""
        with self.lock:
            out = {f"fully_async/count/{k}": float(v) for k, v in sorted(self.counts.items())}
            out["fully_async/count/queue_size"] = float(len(self.queue))
            out["fully_async/count/in_flight_groups"] = float(len(self.inflight))
            occupancy = self._occupancy.take(self.load)
            out["fully_async/slot_occupancy"] = sum(occupancy) / len(occupancy)
            if len(occupancy) > 1:
                out.update({f"fully_async/slot_occupancy/rank{r}": o for r, o in enumerate(occupancy)})
            out["fully_async/queue_wait_s"] = self._wait[0] / self._wait[1] if self._wait[1] else 0.0
            self._wait = [0.0, 0]
            out["fully_async/admissions_per_version"] = float(self._admitted[0])
        out.update(self.controller.metrics())
        return out


def queued_form(g: InFlightGroup) -> Group:
    return Group(g.group_id, g.epoch, g.index, g.start_version, g.samples)
