"""The Rollouter's rollout ranks as ``slots.RankStream``s (``OwnRank``: its own engine, on its generation thread;
``RemoteRank``: another rank, stepping on a thread of its own and reached by calls) and ``RankPorts``, a turn of the
producer's loop (``loop.turn``) over them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncrl.calls import Handle, Pending
from asyncrl.roles.clients import RolloutWorkerClient
from asyncrl.rollout.streaming import StreamingEngine
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.slots import RankStream
from asyncrl.schedules.loops import clock_step
from asyncrl.types import PrefillStats, Sample, SamplingParams
from asyncrl.workers.stream_loop import BusySpan

WAIT_S = 0.5  # a remote rank's long poll, seconds: it returns at once when a row ends


class OwnRank:
    """The Rollouter's own engine: ``advance`` decodes one step on the calling (generation) thread."""

    def __init__(self, engine: StreamingEngine, params: SamplingParams, seed: int, span: BusySpan):
        self.engine, self.params, self.seed, self.span = engine, params, seed, span
        self.busy_s, self.tokens = 0.0, 0  # seconds in steps, tokens decoded, since the Rollouter's take_metrics

    def submit(self, rows: list[Sample]) -> None:
        self.engine.submit(rows, self.params, self.seed)

    def advance(self) -> list[Sample]:
        live = self.engine.live_rows()
        if not live:
            return []
        self.span.busy(live, self.engine.version)
        t0 = time.perf_counter()
        ended = self.engine.step()
        self.busy_s += time.perf_counter() - t0
        self.tokens += min(live, self.engine.capacity)
        if not self.engine.live_rows():
            self.span.idle()
        return ended

    def holds_live_rows(self) -> bool:
        """Whether the next ``advance`` decodes here (the generation thread must not sleep)."""
        return self.engine.live_rows() > 0

    def request_interrupt(self) -> None:
        """Nothing to ask ahead: ``interrupt`` runs on the calling thread."""

    def interrupt(self) -> list[Sample]:
        self.span.idle()
        return self.engine.interrupt()

    def take_prefill(self) -> PrefillStats:
        return self.engine.take_prefill()


class RemoteRank:
    """Another rollout rank (a threaded ``RolloutWorker``): ``submit`` does not wait; ``advance`` collects the answer
    of the outstanding long poll when it has come, and starts the next while the rank holds rows."""

    def __init__(self, handle: Handle, params: SamplingParams, seed: int, timeout_s: float, wake: threading.Event):
        self.rank = RolloutWorkerClient(handle)
        self.params, self.seed, self.timeout_s, self.wake = params, seed, timeout_s, wake
        self.held = 0  # rows submitted there and not handed back
        self._poll: Pending | None = None
        self._submits: list[Pending] = []
        self._interrupt: Pending | None = None
        self._early: Pending | None = None  # an interrupt sent from the driver's thread as a pause began
        self._lock = threading.Lock()
        self.prefill = PrefillStats()

    def submit(self, rows: list[Sample]) -> None:
        self._submits.append(self.rank.stream_submit(rows, self.params, self.seed))
        self.held += len(rows)

    def advance(self) -> list[Sample]:
        for p in [p for p in self._submits if p.done()]:
            self._submits.remove(p)
            p.result()  # raises what the submit raised there
        out: list[Sample] = []
        if self._poll is not None and self._poll.done():
            out = self._collect(self._poll.result())
        if self._poll is None and self.held > 0:
            self._poll = self.rank.stream_wait(WAIT_S)
            self._poll.on_done(self.wake.set)
        return out

    def holds_live_rows(self) -> bool:
        """Rows decode there on the rank's own thread: the generation thread may sleep until ``wake``."""
        return False

    def _collect(self, got: tuple[list[Sample], PrefillStats]) -> list[Sample]:
        rows, prefill = got
        self._poll = None
        self.prefill += prefill
        self.held -= len(rows)
        return rows

    def stop_soon(self) -> None:
        """From the driver's thread as a pause begins: the rank stops decoding now, not when the generation thread
        reaches its park point (its own engine's step then runs on the cores the ranks leave). Rows submitted after
        it are taken by ``request_interrupt``; ``interrupt`` collects both answers."""
        with self._lock:
            if self._early is None and self.held > 0:
                self._early = self.rank.stream_interrupt(self.timeout_s)

    def request_interrupt(self) -> None:
        """Ask the rank to stop now (its submits are in first); ``interrupt`` collects the answer. Every rank is
        asked before any answer is waited for, so a pause costs the slowest rank's stop, not their sum."""
        for p in self._submits:
            p.result(timeout=self.timeout_s)
        self._submits = []
        self._interrupt = self.rank.stream_interrupt(self.timeout_s)

    def interrupt(self) -> list[Sample]:
        if self._interrupt is None:
            self.request_interrupt()
        asked, self._interrupt = self._interrupt, None
        with self._lock:
            early, self._early = self._early, None
        rows = early.result(timeout=self.timeout_s) if early is not None else []
        rows += asked.result(timeout=self.timeout_s)  # type: ignore[union-attr]
        self.held -= len(rows)
        if self._poll is not None:
            rows = self._collect(self._poll.result(timeout=self.timeout_s)) + rows
        return rows

    def take_prefill(self) -> PrefillStats:
        out, self.prefill = self.prefill, PrefillStats()
        return out


@dataclass
class RankPorts:
    """``loop.TurnPorts`` over ``RankStream``s, each advanced in turn on the calling thread; a finished group's put
    waits up to ``put_timeout_s`` at a time for room in the queue until ``leave_put()`` (``Producer.put_finished``)."""

    books: Producer
    ranks: Sequence[RankStream]
    put_timeout_s: float = 0.0
    leave_put: Callable[[], bool] = lambda: True

    def submit(self, rank: int, rows: list[Sample]) -> None:
        self.ranks[rank].submit(rows)

    @clock_step
    def advance(self) -> list[list[Sample]]:
        return [rank.advance() for rank in self.ranks]

    def decoding(self) -> bool:
        return any(rank.holds_live_rows() for rank in self.ranks)

    def put(self) -> bool:
        return self.books.put_finished(self.put_timeout_s, self.leave_put)

    def interrupt(self) -> None:
        """Every row back from every rank, partial: they stay in their groups, to be placed again. Every rank is asked
        at once, then answers; a rank may hand back rows that had ended too: they go to their completion."""
        for r in self.ranks:
            r.request_interrupt()
        for k, r in enumerate(self.ranks):
            self.books.returned(k, r.interrupt())
        if self.books.rows_out():
            raise RuntimeError(f"Producer: {self.books.rows_out()} rows still on the engines after interrupt")
