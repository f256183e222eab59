"""The ``fully_async`` producer: what its loop (``loop.produce``, one engine step a ``loop.turn``) does to its books.

``rollouter.Rollouter`` runs the loop on its generation thread, the performance model (``asyncrl.planning.stream``) on
a virtual clock. How it streams, and how it parks at a sync: docs/schedules/fully_async.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from asyncrl.schedules.fully_async.books import Books, queued_form
from asyncrl.schedules.fully_async.recovery import InFlightGroup
from asyncrl.types import Sample


class Producer(Books):
    """What the producer's loop (``loop.produce``) does to its books, in plain Python: no thread, no engine, no clock
    of its own. The driver's side (``take``, ``on_sync``, ``snapshot``, ``restore``) is the books' (``books.Books``).
    """

    def rows_out(self) -> int:
        """Rows on the engines (submitted, not yet returned)."""
        return sum(self.load)

    def rows_waiting(self) -> bool:
        """Whether rows of groups in flight wait to be placed (interrupted, or an agent's next turn)."""
        return bool(self._unplaced)

    def rows_completing(self) -> int:
        """Rows that ended and wait for their completion (a reward, a tool call)."""
        return len(self.completing)

    def place(self, admit: bool = True) -> list[tuple[int, list[Sample]]]:
        """Rows to submit, by rank: first the unfinished rows of groups on no engine (start order), then (``admit``)
        new groups while the controller, ``max_groups``, ``max_completing`` and a free slot allow."""
        out: dict[int, list[Sample]] = {}
        with self.lock:
            for gid in sorted(self._unplaced, key=self._unplaced.__getitem__):
                if not self._put_on_rank(self.inflight[gid], out):
                    return list(out.items())
            while admit and len(self.inflight) < self.max_groups and self._room() is not None:
                if self.max_completing is not None and self.rows_completing() >= self.max_completing:
                    break
                if not self.controller.can_start():
                    break
                self._put_on_rank(self._admit_one(), out)
        return list(out.items())

    def _room(self) -> int | None:
        """The least loaded rank with a free slot (its rows, waiting ones included, under its capacity), or None."""
        free = [(load, r) for r, (load, cap) in enumerate(zip(self.load, self.capacities)) if load < cap]
        return min(free)[1] if free else None

    def _put_on_rank(self, g: InFlightGroup, out: dict[int, list[Sample]]) -> bool:
        rank = self._room()
        if rank is None:
            return False
        rows = self._waiting(g)
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
        blank = [Sample.blank(prompt, version, j) for j in range(self.n)]
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

    def returned(self, rank: int, rows: list[Sample]) -> None:
        """Rows rank ``rank`` handed back go back to their groups: an interrupted one waits to be placed again, an
        ended one goes to its completion (``complete``), which hands it back on its own thread (``completed``)."""
        ended: list[Sample] = []
        with self.lock:
            for s in rows:
                gid, where = self.placed.pop((s.uid, s.row), (None, None))
                if gid is None or where != rank:
                    raise RuntimeError(f"Producer: rank {rank} returned row {s.row} of prompt {s.uid}, not on it")
                group = self.inflight[gid]
                group.samples[s.row] = s
                self.load[rank] -= 1
                self._out[gid] -= 1
                if self._out[gid] == 0:
                    del self._out[gid]
                if s.stop_reason == "interrupted":
                    self.counts["interrupted_rows"] += 1
                else:
                    self._pending[gid] += 1
                    self.completing[(s.uid, s.row)] = gid
                    ended.append(s)
                self._settle(group)
            self._occupancy.update(self.load)
        for s in ended:
            self.complete(s, self.completed)

    def completed(self, sample: Sample) -> None:
        """A row's completion is done (its reward scored; or an agent's next turn, the row "interrupted" again with
        the tool's tokens appended, to be placed again). Thread-safe: completions call it from their own threads."""
        with self.lock:
            gid = self.completing.pop((sample.uid, sample.row), None)
            if gid is None:
                raise RuntimeError(f"Producer: row {sample.row} of prompt {sample.uid} completed, not completing")
            group = self.inflight[gid]
            group.samples[sample.row] = sample
            self._pending[gid] -= 1
            if not self._pending[gid]:
                del self._pending[gid]
            self._settle(group)
        self.wake.set()

    def _settle(self, g: InFlightGroup) -> None:
        """Where a group goes once none of its rows is on an engine or completing: back to placement (rows left to
        decode), dropped (dynamic sampling: no reward spread; its prompt recorded as filtered) or to the queue."""
        gid = g.group_id
        if self._waiting(g):
            self._unplaced[gid] = self._order[gid]
        if self._out.get(gid) or self._pending.get(gid) or not g.finished:
            return
        self.ledger.generated(gid)
        if self.keep is not None and not self.keep(g.samples):
            self.controller.on_dropped([gid])
            self.ledger.filtered([gid])
            del self.inflight[gid]
            del self._order[gid]
            self.counts["filtered_groups"] += 1
        else:
            self._finished_at[gid] = self.clock()
            self._done[gid] = self._order[gid]

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
                    res = self.queue.put(queued_form(self.inflight[gid]), timeout=timeout_s)
                    if res.accepted:
                        self._queued(self.inflight[gid], res.dropped)
                        moved = True
                        break
                if stop() or self.taker_waiting:
                    return moved
        return moved
