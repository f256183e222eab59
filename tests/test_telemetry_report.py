"""PNG reports from a run directory's metrics.jsonl and timeline.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.telemetry.report import compare_report, write_report
from asyncrl.telemetry.timeline import Timeline, write_chrome_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_metrics(run_dir: Path, steps: int = 6) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step, "time": 1000.0 + step, "reward/mean": step / steps, "timing_s/step": 1.0}
        if step % 3 == 0:
            record["val/accuracy"] = step / (2 * steps)
        if step == 2:
            record["reward/mean"] = None  # a NaN written as null
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _write_timeline(run_dir: Path, overlapped: bool) -> None:
    """Three steps of generate/train; ``overlapped`` mimics one_step_off, otherwise the two alternate (sync)."""
    t = 1000.0
    tl = Timeline(worker="driver", clock=lambda: t + 2.0)  # instants land at the end of each step's generate
    step_s = 2.0 if overlapped else 3.5
    for step in range(3):
        tl.add_span("generate", t, t + 2.0, step=step, worker="rollout0")
        train_start = t + 0.5 if overlapped else t + 2.0
        tl.add_span("wait_batch", t, train_start, step=step, worker="trainer0")
        tl.add_span("train", train_start, train_start + 1.5, step=step, worker="trainer0")
        tl.add_span("step", t, t + step_s, step=step, worker="driver")
        tl.add_span("log", t + 0.1, t + 0.3, step=step, worker="driver")  # nested inside "step"
        tl.instant("weights_updated", step=step, worker="rollout0")
        t += step_s
    write_chrome_trace(run_dir / "timeline.json", tl.events())


def _assert_png(path: Path) -> None:
    assert path.exists()
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # a real figure, not an empty canvas


def test_report_with_timeline_draws_curves_and_gantt(tmp_path: Path) -> None:
    _write_metrics(tmp_path)
    _write_timeline(tmp_path, overlapped=True)
    out = write_report(tmp_path)
    assert out == tmp_path / "report.png"
    _assert_png(out)


def test_report_without_timeline_draws_curves_only(tmp_path: Path) -> None:
    _write_metrics(tmp_path)
    _assert_png(write_report(tmp_path))


def test_report_without_metrics_names_the_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "metrics.jsonl")):
        write_report(tmp_path)


def test_compare_report_stacks_runs_and_requires_each_timeline(tmp_path: Path) -> None:
    for name, overlapped in (("sync", False), ("one_step_off", True)):
        _write_metrics(tmp_path / name)
        _write_timeline(tmp_path / name, overlapped)
    out = compare_report([tmp_path / "sync", tmp_path / "one_step_off"], tmp_path / "cmp" / "compare.png")
    _assert_png(out)

    _write_metrics(tmp_path / "no_trace")
    with pytest.raises(FileNotFoundError, match="no_trace"):
        compare_report([tmp_path / "sync", tmp_path / "no_trace"], tmp_path / "x.png")


def test_a_step_window_keeps_only_those_steps_spans(tmp_path: Path) -> None:
    from asyncrl.telemetry.report import _step_window
    from asyncrl.telemetry.timeline import read_chrome_trace

    _write_metrics(tmp_path / "sync")
    _write_timeline(tmp_path / "sync", overlapped=False)
    events = read_chrome_trace(tmp_path / "sync" / "timeline.json")
    window = _step_window(events, 1, 1)
    assert {e.get("step") for e in window if "end_s" in e and e["end_s"] > e["start_s"]} == {1}  # 0 and 2 cut
    _assert_png(compare_report([tmp_path / "sync"], tmp_path / "w.png", steps=(1, 2)))
    with pytest.raises(ValueError, match="no driver step spans for steps 7..9"):
        _step_window(events, 7, 9)
