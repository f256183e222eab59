"""A rollout rank that streams for the ``fully_async`` Rollouter: its engine steps on a thread of its own while rows
are held, the Rollouter submits rows without waiting, and takes the ended ones in a long poll.

``RolloutWorker`` holds one (``stream_submit`` / ``stream_wait`` / ``stream_interrupt``). Every row the engine
hands back goes to exactly one caller: ``wait`` takes what ended so far, ``interrupt`` takes the rest (the rows that
ended and were not taken yet, and the live ones, partial), both under one lock.
"""

from __future__ import annotations

import threading
import time

from asyncrl.rollout.streaming import StreamingEngine
from asyncrl.telemetry.timeline import Timeline
from asyncrl.types import PrefillStats, Sample, SamplingParams


class StreamLoopError(RuntimeError):
    """The rank's stepping thread failed; names the error."""


class BusySpan:
    """One ``generate`` span on the timeline per stretch of time an engine holds rows (a span per step would be
    thousands); ``rows`` is the most rows held at once in it."""

    def __init__(self, timeline: Timeline, worker: str):
        self.timeline, self.worker = timeline, worker
        self.start: float | None = None
        self.rows, self.version = 0, 0

    def busy(self, rows: int, version: int) -> None:
        if self.start is None:
            self.start, self.rows, self.version = time.time(), rows, version
        self.rows = max(self.rows, rows)

    def idle(self) -> None:
        if self.start is not None:
            self.timeline.add_span(
                "generate", self.start, time.time(), worker=self.worker, version=self.version, rows=self.rows
            )
            self.start = None


class StreamLoop:
    """Steps ``engine`` on a daemon thread while it holds rows (started by the first ``submit``; it lives as long as
    the worker's process)."""

    def __init__(self, engine: StreamingEngine, timeline: Timeline, worker: str):
        self.engine = engine
        self.span = BusySpan(timeline, worker)
        self._cv = threading.Condition()
        self._out: list[Sample] = []  # rows that ended, not yet taken
        self._want_interrupt = False
        self._released = False  # an interrupt came: the next ``wait`` returns at once
        self._interrupting = threading.Lock()
        self._interrupted: list[Sample] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None) -> None:
        self._check()
        self.engine.submit(rows, params, seed)
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stream-rank", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def wait(self, timeout_s: float) -> tuple[list[Sample], PrefillStats]:
        """The rows that ended since the last call, waiting up to ``timeout_s`` for one; the prefill counts. The
        first wait after an interrupt returns at once: a poll sent before the interrupt may arrive after it, and the
        pause that interrupted collects its answer."""

        def ready() -> bool:
            return bool(self._out) or self._error is not None or self._want_interrupt or self._released

        with self._cv:
            self._cv.wait_for(ready, timeout_s)
            self._released = False
            out, self._out = self._out, []
        self._check()
        return out, self.engine.take_prefill()

    def interrupt(self, timeout_s: float) -> list[Sample]:
        """Every row not yet taken: the ended ones, then the live ones as partial "interrupted" rows. Interrupts
        that arrive together (a pause's early stop and its own) run one after the other."""
        with self._interrupting, self._cv:
            self._released = True
            self._cv.notify_all()
            if self._thread is None or not self._thread.is_alive():
                back = self._out + (self.engine.interrupt() if self.engine.live_rows() else [])
                self._out = []
                return back
            self._want_interrupt = True
            self._cv.notify_all()
            ok = self._cv.wait_for(lambda: self._interrupted is not None or self._error is not None, timeout_s)
            back, self._out = self._out + (self._interrupted or []), []
            self._interrupted, self._want_interrupt = None, False
        self._check()
        if not ok:
            raise StreamLoopError(f"interrupt: the rank's engine did not stop within {timeout_s:g} s")
        return back

    def _check(self) -> None:
        if self._error is not None:
            raise StreamLoopError(f"the rank's stepping thread failed: {self._error!r}") from self._error

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self._want_interrupt or self.engine.live_rows() > 0)
                    if self._want_interrupt:
                        self._interrupted = self.engine.interrupt()
                        self._want_interrupt = False
                        self.span.idle()
                        self._cv.notify_all()
                        continue
                self.span.busy(self.engine.live_rows(), self.engine.version)
                ended = self.engine.step()
                with self._cv:
                    self._out.extend(ended)
                    if self.engine.live_rows() == 0:
                        self.span.idle()
                    if ended:
                        self._cv.notify_all()
        except BaseException as e:  # surfaced by the next call
            with self._cv:
                self._error = e
                self._cv.notify_all()
