"""How the driver calls a role, whatever runs it: a ``Handle`` issues a method call and returns a ``Pending``.

Two backends implement this (``asyncrl.workers.backends``): Ray actors, and plain objects in the driver's process
with one call thread each. Both keep the actor contract: a worker runs one call at a time (unless it is made
concurrent, like the Rollouter, which answers the driver while its generation thread runs), and calls to different
workers run at the same time. Everything above (typed role clients, the weight sync, schedules) is written against
these two protocols only, so it runs unchanged on either backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from asyncrl.comm.transport import WorkerLocation

T = TypeVar("T", covariant=True)
R = TypeVar("R")


class Pending(Protocol[T]):
    """A call in flight on a role."""

    def result(self, timeout: float | None = None) -> T:
        """Wait for the call (up to ``timeout`` seconds) and return its value or raise its error; raises
        ``TimeoutError`` if it is still running then."""
        ...

    def done(self) -> bool: ...

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on some thread) once the call has finished, at once if it has."""
        ...


class Handle(Protocol):
    """One worker on one backend."""

    name: str

    def call(self, method: str, *args: Any, **kwargs: Any) -> Pending[Any]: ...

    def kill(self) -> None: ...

    def location(self, timeout_s: float | None = None) -> WorkerLocation:
        """Where the worker runs: its node's address, its GPUs."""
        ...


class CallTimeoutError(TimeoutError):
    """A call waited for without a timeout of its own found no answer within ``trainer.call_timeout_s``: the
    worker is hung (a dead one raises at once). Names the worker and the method."""


def wait_with_deadline(
    wait: Callable[[float | None], R], timeout: float | None, deadline_s: float | None, label: str
) -> R:
    """``wait(timeout)``; a wait without a timeout of its own gets ``deadline_s`` (the handle's
    ``trainer.call_timeout_s``) and, past it, a ``CallTimeoutError`` naming ``label`` (worker.method)."""
    if timeout is not None or deadline_s is None:
        return wait(timeout)
    try:
        return wait(deadline_s)
    except TimeoutError:
        raise CallTimeoutError(
            f"{label}: no answer within trainer.call_timeout_s={deadline_s:g} s; the worker is hung (raise the "
            f"deadline if such a call can legitimately take longer)"
        ) from None


def error_text(e: BaseException) -> str:
    """A worker's error as one line: the worker-side exception's own text (Ray wraps it), or what killed the worker."""
    cause = getattr(e, "cause", None)
    if cause is not None:  # Ray's wrapper of a worker-side exception
        return str(cause)
    if type(e).__module__.startswith("ray."):  # the actor died, or Ray itself failed
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return str(e)


def gather(
    labelled: Sequence[tuple[str, Pending[R]]], timeout_s: float
) -> tuple[dict[str, R], list[tuple[str, str]], list[str]]:
    """Wait for every call until one shared deadline: (label -> result, [(label, error text)], [labels unfinished]).

    A call still running at the deadline is "unfinished"; a call that raised (a worker's own timeout included) is an
    error with its text, so the precise worker-side message is never mistaken for the driver giving up."""
    results: dict[str, R] = {}
    errors: list[tuple[str, str]] = []
    unfinished: list[str] = []
    deadline = time.monotonic() + timeout_s
    for label, pending in labelled:
        try:
            results[label] = pending.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError as e:
            if pending.done():
                errors.append((label, error_text(e)))
            else:
                unfinished.append(label)
        except Exception as e:  # noqa: BLE001 - every worker's failure is reported, not only the first
            errors.append((label, error_text(e)))
    return results, errors, unfinished
