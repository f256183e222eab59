"""Wall-clock spans of what each worker did when, for Chrome/Perfetto traces and idle-time accounting.

Every process (driver, each Ray worker) keeps its own :class:`Timeline` (usually the one from :func:`get_timeline`)
and records spans around its phases::

    tl = get_timeline()
    with tl.span("generate", step=3, worker="rollout0", n_prompts=64):
        ...

Workers return ``tl.drain()`` to the driver (events are plain dicts, so they pickle through Ray), the driver
``extend``s its own timeline with them and writes ``timeline.json`` with :func:`write_chrome_trace`. Times are
``time.time()`` (Unix seconds), so spans from different processes on one machine line up; across machines they are
only as aligned as the clocks are. The events' fields: :class:`Event`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict, cast

IDLE_PREFIXES: tuple[str, ...] = ("wait", "idle")  # spans named like this mean "blocked", not "busy"


class Event(TypedDict):
    """One span or instant, as it pickles between processes and goes into ``timeline.json``."""

    name: str
    kind: str  # "span" | "instant"
    worker: str
    thread: str
    start_s: float  # Unix seconds
    end_s: float  # Unix seconds; equals start_s for an instant
    step: int | None
    args: dict[str, Any]  # the caller's keyword arguments, whatever they are (written with str() where not JSON)


class Timeline:
    """Thread-safe, in-memory list of span/instant events for one process.

    ``worker`` is the default row name for events that do not pass ``worker=`` (set it once in a Ray actor's
    ``__init__``, e.g. ``get_timeline().worker = "trainer0"``). ``clock`` returns Unix seconds; tests pass a fake one.
    """

    def __init__(self, worker: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.worker: str = worker or f"pid{os.getpid()}"
        self._clock = clock
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def _add(
        self,
        name: str,
        kind: str,
        start_s: float,
        end_s: float,
        step: int | None,
        worker: str | None,
        args: dict[str, object],
    ) -> None:
        event: Event = {
            "name": name,
            "kind": kind,
            "worker": worker or self.worker,
            "thread": threading.current_thread().name,
            "start_s": start_s,
            "end_s": end_s,
            "step": step,
            "args": args,
        }
        with self._lock:
            self._events.append(event)

    @contextmanager
    def span(self, name: str, step: int | None = None, worker: str | None = None, **args: object) -> Iterator[None]:
        """Record the wall-clock interval of the ``with`` body. An exception still closes the span (with
        ``args["error"]`` set to the exception type) and propagates."""
        start_s = self._clock()
        try:
            yield
        except BaseException as e:
            args["error"] = type(e).__name__
            raise
        finally:
            self._add(name, "span", start_s, self._clock(), step, worker, args)

    def instant(self, name: str, step: int | None = None, worker: str | None = None, **args: object) -> None:
        """Record a point in time (e.g. "weights_updated")."""
        now_s = self._clock()
        self._add(name, "instant", now_s, now_s, step, worker, args)

    def add_span(
        self,
        name: str,
        start_s: float,
        end_s: float,
        step: int | None = None,
        worker: str | None = None,
        **args: object,
    ) -> None:
        """Record a span measured elsewhere (Unix seconds), e.g. timings reported by an inference engine."""
        if end_s < start_s:
            raise ValueError(f"Timeline.add_span({name!r}): end_s={end_s} is before start_s={start_s}")
        self._add(name, "span", float(start_s), float(end_s), step, worker, args)

    def events(self) -> list[Event]:
        """A copy of all events so far (picklable plain dicts)."""
        with self._lock:
            return [Event(**e) for e in self._events]

    def drain(self) -> list[Event]:
        """All events so far, removing them: lets a worker ship its spans incrementally without sending any twice."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def extend(self, events: Iterable[Mapping[str, object]]) -> None:
        """Add events recorded by another process (the output of its ``events()``/``drain()``); ``kind``,
        ``thread``, ``step`` and ``args`` may be left out (a span on the main thread, no step, no args)."""
        incoming: list[Event] = []
        for e in events:
            missing = {"name", "worker", "start_s", "end_s"} - e.keys()
            if missing:
                raise ValueError(f"Timeline.extend: event {dict(e)!r} lacks {sorted(missing)}")
            incoming.append(cast(Event, {"kind": "span", "thread": "main", "step": None, "args": {}, **e}))
        with self._lock:
            self._events.extend(incoming)


_GLOBAL: Timeline | None = None
_GLOBAL_LOCK = threading.Lock()


def get_timeline() -> Timeline:
    """This process's shared timeline, created on first use."""
    global _GLOBAL
    with _GLOBAL_LOCK:
        if _GLOBAL is None:
            _GLOBAL = Timeline()
        return _GLOBAL


def _us(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def _jsonable(value: object) -> object:
    """Span args as JSON: numbers/strings/bools/None as-is, containers recursively, anything else as ``str``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def to_chrome_trace(events: Iterable[Event]) -> dict[str, object]:
    """Chrome trace-event JSON object for ``events``.

    Each worker becomes a process (``pid`` 1, 2, ... in sorted-name order, with ``process_name`` metadata so Perfetto
    shows the name) and each thread within it a ``tid`` (with ``thread_name`` metadata). Spans are complete events
    (``"ph": "X"``), instants ``"ph": "i"``; ``ts``/``dur`` are integer microseconds since the Unix epoch.
    """
    events = list(events)
    pids = {w: i + 1 for i, w in enumerate(sorted({str(e["worker"]) for e in events}))}
    tids: dict[tuple[str, str], int] = {}
    trace: list[dict[str, object]] = []
    for worker, pid in pids.items():
        trace.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": worker}})
        trace.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for e in sorted(events, key=lambda e: e["start_s"]):
        worker, thread = str(e["worker"]), str(e.get("thread", "main"))
        pid, tid = pids[worker], tids.get((worker, thread))
        if tid is None:
            tid = tids[(worker, thread)] = sum(1 for w, _ in tids if w == worker) + 1
            trace.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
        args = {str(k): _jsonable(v) for k, v in (e.get("args") or {}).items()}
        if e.get("step") is not None:
            args["step"] = e["step"]
        ts = _us(e["start_s"])
        instant = e.get("kind", "span") == "instant"
        phase = {"ph": "i", "s": "t"} if instant else {"ph": "X", "dur": max(0, _us(e["end_s"]) - ts)}
        trace.append({"name": e["name"], "cat": "asyncrl", "pid": pid, "tid": tid, "ts": ts, **phase, "args": args})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str | os.PathLike[str], events: Iterable[Event]) -> Path:
    """Write ``events`` as a Chrome trace (open in https://ui.perfetto.dev or chrome://tracing); returns the path.

    Written to a temporary file and renamed, so a crash mid-write never leaves a truncated ``timeline.json``.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(to_chrome_trace(events)), encoding="utf-8")
    os.replace(tmp, p)
    return p


def read_chrome_trace(path: str | os.PathLike[str]) -> list[Event]:
    """Events back from a trace written by :func:`write_chrome_trace` (worker/thread names restored)."""
    p = Path(path)
    try:
        trace = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"read_chrome_trace: {p} is not valid JSON: {e}") from e
    raw = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(raw, list):
        raise ValueError(f"read_chrome_trace: {p} has no traceEvents list")
    workers = {e["pid"]: e["args"]["name"] for e in raw if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in raw if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    events: list[Event] = []
    for e in raw:
        if e.get("ph") not in ("X", "i", "I"):
            continue
        args = dict(e.get("args") or {})
        start_s = e["ts"] / 1e6
        events.append(
            {
                "name": e["name"],
                "kind": "span" if e["ph"] == "X" else "instant",
                "worker": workers.get(e["pid"], str(e["pid"])),
                "thread": threads.get((e["pid"], e.get("tid")), str(e.get("tid"))),
                "start_s": start_s,
                "end_s": start_s + e.get("dur", 0) / 1e6,
                "step": args.pop("step", None),
                "args": args,
            }
        )
    return events


def span_totals(events: Iterable[Event], step: int | None = None, worker: str | None = None) -> dict[str, float]:
    """Total seconds per span name (summed over workers and threads), optionally for one step and/or one worker."""
    totals: dict[str, float] = {}
    for e in events:
        if e.get("kind", "span") != "span":
            continue
        if (step is not None and e.get("step") != step) or (worker is not None and e["worker"] != worker):
            continue
        totals[e["name"]] = totals.get(e["name"], 0.0) + (e["end_s"] - e["start_s"])
    return totals


def idle_fraction(events: Iterable[Event], worker: str, t0: float, t1: float) -> float:
    """Fraction of the window ``[t0, t1]`` (Unix seconds) in which ``worker`` had no busy span running.

    Busy time is the *union* of the worker's busy spans clipped to the window, so nested or overlapping spans (a
    "step" span around "generate", two threads at once) are not double-counted. "wait*"/"idle*" spans are not busy.
    """
    if not t1 > t0:
        raise ValueError(f"idle_fraction(worker={worker!r}): window end t1={t1} must be after t0={t0}")
    intervals = [
        (max(e["start_s"], t0), min(e["end_s"], t1))
        for e in events
        if e["worker"] == worker and e.get("kind", "span") == "span" and e["end_s"] > t0 and e["start_s"] < t1
        if not str(e["name"]).lower().startswith(IDLE_PREFIXES)
    ]
    return 1.0 - union_seconds(intervals) / (t1 - t0)


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals (overlaps counted once)."""
    blocks: list[list[float]] = []  # the union's disjoint [start, end] blocks, in order
    for start, end in sorted(intervals):
        if blocks and start <= blocks[-1][1]:
            blocks[-1][1] = max(blocks[-1][1], end)
        else:
            blocks.append([start, end])
    return sum((end - start for start, end in blocks), 0.0)
