"""The ``fully_async`` producer: streams prompt groups into the bounded queue, one event at a time.

``Producer`` is its books and its loop in plain Python: the prompt stream (an ``EpochSampler`` plus prompts to
re-issue), the ``StalenessController`` that admits new groups, the ``MessageQueue`` the trainer pulls from, the
``PromptLedger`` that proves every prompt is trained on exactly once, and the groups in flight with the rollout rank
each one's rows are on. Its loop (``Producer.turn``), one engine step at a time:

    place: groups whose rows are on no engine (interrupted at a sync, restored from a checkpoint) go back first, then
        new groups while the controller admits them and a rank has free slots for their n rows (least loaded rank
        first); the rows enter each engine's decode at its next step
    advance every rank's engine one step (a remote rank: collect what it reported meanwhile); every row that ended
        goes back to its group
    a group whose n rows have ended is scored (rule rewards) and queued at once (dynamic sampling: a group without
        a reward spread is dropped instead and its prompt recorded as filtered), whatever older groups are doing

So a finished row frees its slot at the step it ends and a new group takes it at the next: the engine never waits for
a batch's longest row. Concurrency is per rank (``capacities``: each engine's rows at once) and at most
``max_groups`` groups are in flight in all (``stream_concurrency``, which the performance model uses too).

``rollouter.Rollouter`` runs the loop on its generation thread with its engines (``RankPort``: its own in-process,
the other ranks' over calls); the performance model's simulator (``asyncrl.planning.stream``) runs the same
``place`` / ``returned`` / ``finish`` / ``put_finished`` / ``take`` on a virtual clock, its engines priced per step.

At a weight sync the Rollouter parks. With ``partial_rollout`` it interrupts every engine first: the rows come back
with their tokens, log-probs and per-token versions, stay in their groups and are placed again after the sync (they
continue with the new weights); without it no new group is placed and the live rows run to their end (``drain``), so
every response comes from one version. ``snapshot`` (only while parked: no row is on an engine) captures the queue,
the in-flight rows, the controller, the ledger and the prompt cursor together: restoring it loses and repeats
nothing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from asyncrl.data.sampler import EpochSampler
from asyncrl.schedules.fully_async.ledger import PromptLedger
from asyncrl.schedules.fully_async.queue import Group, MessageQueue, QueueClosed
from asyncrl.schedules.fully_async.recovery import InFlightGroup, RollouterSnapshot, StreamBatch, Takeover, advance
from asyncrl.schedules.fully_async.slots import Occupancy, RankPort
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


class Producer:
    """The producer's books and its one loop, in plain Python: no thread, no engine, no clock of its own.

    ``turn`` is one step of the generation loop (the module docstring) over the ranks' ``RankPort``s. The Rollouter
    runs it on its generation thread; the performance model's simulator runs its parts on a virtual clock. The
    driver's side is ``take`` (a trainer step's groups), ``on_sync``, ``snapshot`` and ``restore``.
    ``keep(samples)`` (dynamic sampling) says whether a scored group goes to the queue; None keeps every group.
    """

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
    ):
        if not capacities or min(capacities) < 1:
            raise ValueError(f"Producer: every rank needs a capacity >= 1 row (got {list(capacities)})")
        self.budget, self.queue, self.sampler, self.prompt_of = budget, queue, sampler, prompt_of
        self.n, self.max_groups, self.clock, self.keep = n, max_groups, clock, keep
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

    # ---- the loop --------------------------------------------------------------------------------------------------
    def turn(
        self,
        ports: Sequence[RankPort],
        score: Callable[[list[Sample]], Any] = lambda samples: None,
        put_timeout_s: float = 0.0,
        stop: Callable[[], bool] = lambda: True,
        place: bool = True,
    ) -> bool:
        """One step of the loop: place rows on the ranks (unless ``place`` is False: a drain), advance every rank,
        return the rows that ended to their groups, score and queue the groups that finished. Returns whether
        anything happened (False: nothing is decoding and nothing could be queued, so the caller may wait)."""
        if place:
            for rank, rows in self.place():
                ports[rank].submit(rows)
        moved = False
        for rank, port in enumerate(ports):
            ended = port.advance()
            if ended:
                moved = True
                self.finish(self.returned(rank, ended), score)
        return self.put_finished(put_timeout_s, stop) or moved or self.rows_out() > 0

    def rows_out(self) -> int:
        """Rows on the engines (submitted, not yet returned)."""
        return sum(self.load)

    def place(self) -> list[tuple[int, list[Sample]]]:
        """Rows to submit, by rank: first the unfinished rows of groups on no engine (start order), then new groups
        while the controller admits them, fewer than ``max_groups`` are in flight and a rank has room for ``n``
        rows. A group's rows go to one rank (they share its prefill), the least loaded one with room."""
        out: dict[int, list[Sample]] = {}
        with self.lock:
            for gid in sorted(self._unplaced, key=self._unplaced.__getitem__):
                if not self._put_on_rank(self.inflight[gid], out):
                    return list(out.items())
            while len(self.inflight) < self.max_groups and self._room(self.n) is not None:
                if not self.controller.can_start():
                    break
                self._put_on_rank(self._admit_one(), out)
        return list(out.items())

    def _room(self, rows: int) -> int | None:
        """The least loaded rank with ``rows`` free slots (an idle rank takes any group: a group larger than a rank
        waits in its engine for slots), or None."""
        free = [(load, r) for r, (load, cap) in enumerate(zip(self.load, self.capacities)) if cap - load >= rows]
        free += [(0, r) for r, load in enumerate(self.load) if load == 0]
        return min(free)[1] if free else None

    def _put_on_rank(self, g: InFlightGroup, out: dict[int, list[Sample]]) -> bool:
        rows = [s for s in g.samples if s.stop_reason == "interrupted"]
        rank = self._room(len(rows))
        if rank is None:
            return False
        for s in rows:
            self.placed[(s.uid, s.row)] = (g.group_id, rank)
        self._unplaced.pop(g.group_id, None)
        self._out[g.group_id] += len(rows)
        self.load[rank] += len(rows)
        self._occupancy.update(self.load)
        out.setdefault(rank, []).extend(rows)
        return True

    def _admit_one(self) -> InFlightGroup:
        reissue = self.ledger.to_reissue()
        epoch, index = reissue[0] if reissue else self._next_prompt()
        gid = self.ledger.issue(epoch, index)
        version = self.controller.on_start(gid)
        prompt = replace(self.prompt_of(epoch, index), epoch=epoch)
        blank = [_blank(prompt, version, j) for j in range(self.n)]
        group = self.inflight[gid] = InFlightGroup(gid, epoch, index, version, self.clock(), blank)
        self._order[gid] = self.counts["started_groups"]
        self.counts["started_groups"] += 1
        self._admitted[1] += 1
        return group

    def _next_prompt(self) -> tuple[int, int]:
        while True:
            epoch, index = self.sampler.next_batch()[0]
            if (epoch, index) not in self.skip:
                return epoch, index
            self.skip.discard((epoch, index))

    def returned(self, rank: int, rows: list[Sample]) -> list[InFlightGroup]:
        """Rows rank ``rank`` handed back (ended, or interrupted at a sync) go back to their groups; returns the
        groups whose every row has now ended."""
        done: list[InFlightGroup] = []
        with self.lock:
            for s in rows:
                gid, where = self.placed.pop((s.uid, s.row), (None, None))
                if gid is None or where != rank:
                    raise RuntimeError(f"Producer: rank {rank} returned row {s.row} of prompt {s.uid}, not on it")
                group = self.inflight[gid]
                group.samples[s.row] = s
                self.load[rank] -= 1
                self._out[gid] -= 1
                self.counts["interrupted_rows"] += s.stop_reason == "interrupted"
                if self._out[gid] == 0:  # every row of the group is back
                    del self._out[gid]
                    if group.finished:
                        done.append(group)
                    else:
                        self._unplaced[gid] = self._order[gid]
            self._occupancy.update(self.load)
        return done

    def finish(self, groups: list[InFlightGroup], score: Callable[[list[Sample]], Any]) -> None:
        """Score finished groups (rule rewards, before the queue) and record them generated; with dynamic sampling a
        group without a reward spread leaves here, its slot already free and its prompt recorded as filtered."""
        if not groups:
            return
        score([s for g in groups for s in g.samples])
        with self.lock:
            now = self.clock()
            for g in groups:
                self.ledger.generated(g.group_id)
                self._finished_at[g.group_id] = now
                if self.keep is not None and not self.keep(g.samples):
                    self.controller.on_dropped([g.group_id])
                    self.ledger.filtered([g.group_id])
                    del self.inflight[g.group_id]
                    del self._order[g.group_id]
                    self._finished_at.pop(g.group_id)
                    self.counts["filtered_groups"] += 1
                else:
                    self._done[g.group_id] = self._order[g.group_id]

    def interrupted(self, ports: Sequence[RankPort], score: Callable[[list[Sample]], Any]) -> None:
        """Take every row back from every rank, partial (a sync with partial rollout): they stay in their groups and
        are placed again by the next ``place``. A rank may hand back rows that had ended too: their groups finish."""
        for rank, port in enumerate(ports):
            self.finish(self.returned(rank, port.interrupt()), score)
        if self.rows_out():
            raise RuntimeError(f"Producer: {self.rows_out()} rows still on the engines after interrupt")

    def put_finished(self, timeout_s: float, stop: Callable[[], bool] = lambda: True) -> bool:
        """Queue finished groups in start order, each waiting up to ``timeout_s`` at a time for room until ``stop()``
        says to leave it (still in flight, finished), or the trainer is waiting for a choice (``take``: it takes
        finished groups itself, and the rows still generating must not wait behind a full queue). Returns whether
        any was queued."""
        moved = False
        for gid in sorted(self._done, key=self._done.__getitem__):
            while True:
                with self.lock:  # the put and its bookkeeping are one step for the driver's calls
                    if gid not in self._done:  # the trainer took it meanwhile
                        break
                    res = self.queue.put(_queued_form(self.inflight[gid]), timeout=timeout_s)
                    if res.accepted:
                        self._queued(self.inflight[gid], res.dropped)
                        moved = True
                        break
                if stop() or self.taker_waiting:
                    return moved
        return moved

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
                got[group.group_id] = _queued_form(group)
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
                inflight=list(self.inflight.values()),
                controller=self.controller.state_dict(),
                ledger=self.ledger.state_dict(),
                sampler=self.sampler.state_dict(),
                processing_s=dict(self.processing_s),
                counts=dict(self.counts),
                engine_version=engine_version,
                skip=tuple(sorted(self.skip)),
            )

    def restore(self, take: Takeover) -> None:
        """Load a snapshot, with a takeover's consumption replayed on top (``recovery``), continuing at the
        takeover's version."""
        state = advance(take, self.budget) if take.consumed else take.snapshot
        self.controller.load_state_dict(state.controller)
        self.controller.on_sync(take.version)
        self.ledger.load_state_dict(state.ledger)
        self.skip = set(state.skip)
        self.queue.restore(state.queue)
        self.sampler.load_state_dict(state.sampler)
        self.inflight = {g.group_id: g for g in state.inflight}
        self._order = {gid: k for k, gid in enumerate(self.inflight)}
        self._unplaced = {gid: self._order[gid] for gid, g in self.inflight.items() if not g.finished}
        self._done = {gid: self._order[gid] for gid, g in self.inflight.items() if g.finished}
        self._out = Counter()
        self.processing_s = dict(state.processing_s)
        self.counts = Counter(dict.fromkeys(COUNT_KEYS, 0))
        self.counts.update({k: v for k, v in state.counts.items() if k in COUNT_KEYS})  # an older run's, renamed
        self.placed, self.load = {}, [0] * len(self.capacities)

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


def _queued_form(g: InFlightGroup) -> Group:
    return Group(g.group_id, g.epoch, g.index, g.start_version, g.samples)


def _blank(prompt: Prompt, version: int, row: int) -> Sample:
    """Row ``row`` of a group, not started yet: the engine's ``resume`` continues it from the prompt."""
    return Sample(prompt, [], [], [], stop_reason="interrupted", start_version=version, row=row)
