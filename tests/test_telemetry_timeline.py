"""Timeline spans, Chrome trace output, and busy/idle accounting."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import pytest

from asyncrl.telemetry.timeline import (
    Timeline,
    get_timeline,
    idle_fraction,
    read_chrome_trace,
    span_totals,
    write_chrome_trace,
)


class FakeClock:
    """Unix seconds that advance only when told, so span bounds are exact."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_span_records_wall_clock_bounds_step_worker_and_args() -> None:
    clock = FakeClock()
    tl = Timeline(worker="driver", clock=clock)
    with tl.span("generate", step=3, worker="rollout0", n_prompts=64):
        clock.t += 2.5
    tl.instant("weights_updated", step=3, version=4)
    generate, updated = tl.events()
    assert generate == {
        "name": "generate",
        "kind": "span",
        "worker": "rollout0",
        "thread": threading.current_thread().name,
        "start_s": 1_700_000_000.0,
        "end_s": 1_700_000_002.5,
        "step": 3,
        "args": {"n_prompts": 64},
    }
    assert updated["kind"] == "instant" and updated["worker"] == "driver" and updated["args"] == {"version": 4}
    assert updated["start_s"] == updated["end_s"] == clock.t


def test_span_is_closed_and_marked_when_the_body_raises() -> None:
    tl = Timeline(worker="w")
    with pytest.raises(KeyError):
        with tl.span("train"):
            raise KeyError("boom")
    (event,) = tl.events()
    assert event["args"] == {"error": "KeyError"} and event["end_s"] >= event["start_s"]


def test_worker_events_pickle_and_merge_into_the_driver_timeline() -> None:
    worker_tl = Timeline(worker="trainer0")
    with worker_tl.span("train", step=1):
        pass
    shipped = pickle.loads(pickle.dumps(worker_tl.drain()))  # what a Ray actor would return
    assert worker_tl.events() == []  # drained: nothing is sent twice

    driver_tl = Timeline(worker="driver")
    driver_tl.instant("step_start", step=1)
    driver_tl.extend(shipped)
    assert sorted(e["worker"] for e in driver_tl.events()) == ["driver", "trainer0"]
    with pytest.raises(ValueError, match="lacks"):
        driver_tl.extend([{"name": "x"}])


def test_get_timeline_returns_one_shared_timeline_per_process() -> None:
    assert get_timeline() is get_timeline()


def test_concurrent_spans_from_threads_are_all_recorded_under_their_thread() -> None:
    tl = Timeline(worker="rollout0")

    def work() -> None:
        for i in range(50):
            with tl.span("decode", step=i):
                pass

    threads = [threading.Thread(target=work, name=f"t{k}") for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = tl.events()
    assert len(events) == 200
    assert {e["thread"] for e in events} == {"t0", "t1", "t2", "t3"}


def test_chrome_trace_has_integer_microsecond_complete_events_and_name_metadata(tmp_path: Path) -> None:
    tl = Timeline(worker="driver")
    tl.add_span("generate", 100.0, 101.5, step=0, worker="rollout0", tokens=10)
    tl.add_span("train", 101.5, 102.25, step=0, worker="trainer0")
    tl.add_span("wait_batch", 100.0, 101.5, step=0, worker="trainer0")
    with tl.span("step", step=0):  # the real clock's thread is recorded too
        pass
    path = write_chrome_trace(tmp_path / "timeline.json", tl.events())
    trace = json.loads(path.read_text())

    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == ["driver", "rollout0", "trainer0"]
    assert len(set(names.values())) == 3 and all(isinstance(p, int) for p in names.values())
    thread_meta = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert {(e["pid"], e["tid"]) for e in thread_meta} >= {(names["rollout0"], 1), (names["trainer0"], 1)}

    complete = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(complete) == {"generate", "train", "wait_batch", "step"}
    for e in complete.values():
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and isinstance(e["tid"], int)
    gen = complete["generate"]
    assert (gen["ts"], gen["dur"], gen["pid"]) == (100_000_000, 1_500_000, names["rollout0"])
    assert gen["args"] == {"tokens": 10, "step": 0}
    assert complete["train"]["dur"] == 750_000


def test_chrome_trace_round_trips_through_read_chrome_trace(tmp_path: Path) -> None:
    tl = Timeline(worker="driver")
    tl.add_span("generate", 10.0, 12.0, step=2, worker="rollout0", tokens=5)
    tl.instant("weights_updated", step=2, worker="rollout0")
    write_chrome_trace(tmp_path / "t.json", tl.events())
    back = {e["name"]: e for e in read_chrome_trace(tmp_path / "t.json")}
    gen = back["generate"]
    assert (gen["worker"], gen["start_s"], gen["end_s"], gen["step"], gen["args"]) == (
        "rollout0",
        10.0,
        12.0,
        2,
        {"tokens": 5},
    )
    assert back["weights_updated"]["kind"] == "instant"


def test_span_totals_sum_seconds_per_name_optionally_for_one_step() -> None:
    tl = Timeline(worker="w")
    tl.add_span("generate", 0.0, 2.0, step=1)
    tl.add_span("generate", 0.5, 1.5, step=1, worker="other")
    tl.add_span("train", 2.0, 5.0, step=1)
    tl.add_span("generate", 5.0, 9.0, step=2)
    tl.instant("marker", step=1)
    assert span_totals(tl.events(), step=1) == {"generate": 3.0, "train": 3.0}
    assert span_totals(tl.events()) == {"generate": 7.0, "train": 3.0}
    assert span_totals(tl.events(), worker="other") == {"generate": 1.0}


def test_idle_fraction_counts_the_union_of_busy_spans_and_not_waits() -> None:
    tl = Timeline(worker="trainer0")
    tl.add_span("train", 1.0, 4.0)
    tl.add_span("optimizer", 3.0, 6.0)  # overlaps "train": busy union is [1, 6] = 5 s
    tl.add_span("wait_weights", 6.0, 9.0)  # waiting is idle
    tl.add_span("idle", 0.0, 1.0)
    tl.add_span("log", 9.0, 12.0)  # clipped to the window: 1 s
    tl.add_span("generate", 0.0, 10.0, worker="rollout0")  # another worker
    tl.instant("tick")
    # window [0, 10]: busy 6 s -> idle 40 %
    assert idle_fraction(tl.events(), "trainer0", 0.0, 10.0) == pytest.approx(0.4)
    assert idle_fraction(tl.events(), "rollout0", 0.0, 10.0) == pytest.approx(0.0)
    assert idle_fraction(tl.events(), "nobody", 0.0, 10.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="trainer0"):
        idle_fraction(tl.events(), "trainer0", 5.0, 5.0)
