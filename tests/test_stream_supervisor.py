"""fully_async's StreamSupervisor when a Rollouter call never answers: a Ray Rollouter is replaced (the fault suite),
an in-process one cannot be, and the run stops with one error naming it and why."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from asyncrl.run.supervision import WorkerLostError
from asyncrl.schedules.fully_async import supervisor as supervision
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.workers.backends import LocalPending


def test_a_hung_in_process_rollouter_stops_the_run_with_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(supervision, "GRACE_S", 0.0)
    handle = SimpleNamespace(name="rollouter")
    roles = SimpleNamespace(rollouter=SimpleNamespace(handle=handle))
    sup = supervision.StreamSupervisor(roles, None, None, lambda: 0, 3, 0.05, StalenessBudget())
    never: Future = Future()  # a call that is never answered
    with pytest.raises(WorkerLostError, match=r"rollouter: no answer within 0\.05 s; an in-process Rollouter cannot"):
        sup.call(lambda r: LocalPending(never))
    assert sup.restarts == []  # nothing was counted as replaced
