"""Static PNG summary of a run: learning curves on top, a Gantt chart of who was busy when below
(:func:`compare_report`: several runs' charts on one x scale, e.g. ``sync`` against ``one_step_off``).

Reads only the files a run leaves behind (``metrics.jsonl``, ``timeline.json``), so it works on finished, crashed or
still-running runs alike. Figures are drawn on an explicit Agg canvas instead of through pyplot: no global backend
switch, no display needed, and safe to call from a background thread of the driver.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from asyncrl.telemetry.backends import read_metrics
from asyncrl.telemetry.timeline import Event, read_chrome_trace

if TYPE_CHECKING:
    from asyncrl.telemetry.trace import TraceRecord

RGBA = tuple[float, float, float, float]

METRICS_FILE = "metrics.jsonl"
TIMELINE_FILE = "timeline.json"
REPORT_FILE = "report.png"


def _figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in))
    FigureCanvasAgg(fig)
    return fig


_CURVES = {  # what the learning-curves panel draws, and how
    "reward/mean": {"color": "tab:blue", "linewidth": 1.5},
    "val/accuracy": {"color": "tab:orange", "marker": "o", "linestyle": "--"},
}


def _plot_curves(ax: Axes, records: list[dict[str, float | None]]) -> None:
    plotted = False
    for key, style in _CURVES.items():  # records without the key or with null (non-finite) values are skipped
        kept = [r for r in records if r.get("step") is not None and r.get(key) is not None]
        if kept:
            ax.plot([int(r["step"]) for r in kept], [float(r[key]) for r in kept], label=key, **style)
            plotted = True
    if not plotted:
        ax.text(0.5, 0.5, "no reward/mean or val/accuracy logged", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(loc="best", fontsize="small")
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    ax.grid(True, alpha=0.3)


def _colours(names: list[str]) -> dict[str, RGBA]:
    """A stable colour per span name (sorted order), shared across runs in :func:`compare_report`."""
    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(sorted(names))}


def _lanes(spans: list[Event]) -> tuple[list[int], int]:
    """Sub-row for each span so overlapping spans of one worker (nesting, threads) are stacked, not hidden."""
    lane_end: list[float] = []
    lanes: list[int] = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: (spans[i]["start_s"], -spans[i]["end_s"])):
        span = spans[i]
        for lane, end in enumerate(lane_end):
            if end <= span["start_s"]:
                lanes[i], lane_end[lane] = lane, span["end_s"]
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(span["end_s"])
    return lanes, max(1, len(lane_end))


def _plot_gantt(ax: Axes, events: list[Event], colours: dict[str, RGBA]) -> float:
    """One row per worker, x in seconds since the first event, instants as black ticks; returns the x extent (s)."""
    t_origin_s = min((e["start_s"] for e in events), default=0.0)
    workers = sorted({e["worker"] for e in events})
    for row, worker in enumerate(workers):
        spans = [e for e in events if e["worker"] == worker and e.get("kind", "span") == "span"]
        lanes, n_lanes = _lanes(spans)
        height = 0.8 / n_lanes
        for span, lane in zip(spans, lanes):
            y = row - 0.4 + lane * height
            width = span["end_s"] - span["start_s"]
            ax.broken_barh([(span["start_s"] - t_origin_s, width)], (y, height), facecolors=colours[span["name"]])
        instants = [e["start_s"] - t_origin_s for e in events if e["worker"] == worker and e.get("kind") == "instant"]
        if instants:
            ax.vlines(instants, row - 0.45, row + 0.45, colors="black", linewidth=0.8)
    ax.set_yticks(range(len(workers)), labels=workers)
    ax.set_ylim(-0.6, len(workers) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since run start")
    ax.grid(True, axis="x", alpha=0.3)
    return max((e["end_s"] - t_origin_s for e in events), default=0.0)


def _span_names(events: list[Event]) -> list[str]:
    return sorted({e["name"] for e in events if e.get("kind", "span") == "span"})


def _legend(fig: Figure, colours: dict[str, RGBA]) -> None:
    handles = [Patch(facecolor=c, label=name) for name, c in colours.items()]
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize="small", frameon=False)


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Render ``run_dir/report.png`` from ``metrics.jsonl`` (+ ``timeline.json`` if present); returns its path.

    A missing timeline is normal (telemetry spans off, or the run died before writing it): then only the curves are
    drawn and the title says so. A missing ``metrics.jsonl`` means this is not a run directory, so that raises.
    """
    run = Path(run_dir)
    records = read_metrics(run / METRICS_FILE)
    timeline_path = run / TIMELINE_FILE
    events = read_chrome_trace(timeline_path) if timeline_path.exists() else None

    title = f"asyncrl run {run.resolve().name}"
    traced = _last_traced(run)
    extra = 1.6 if traced else 0.0
    if events is None:
        fig = _figure(10, 4.5 + extra)
        axes = fig.subplots(2 if traced else 1, 1, squeeze=False)[:, 0]
        ax_curves = axes[0]
        title += f" (no {TIMELINE_FILE}: curves only)"
    else:
        n_workers = max(1, len({e["worker"] for e in events}))
        fig = _figure(12, 5 + 0.5 * n_workers + extra)
        ratios = [3, max(2, n_workers * 0.6)] + ([1.4] if traced else [])
        axes = fig.subplots(len(ratios), 1, gridspec_kw={"height_ratios": ratios})
        ax_curves, ax_gantt = axes[0], axes[1]
        colours = _colours(_span_names(events))
        _plot_gantt(ax_gantt, events, colours)
        ax_gantt.set_title("timeline (one row per worker)", fontsize="medium")
        _legend(fig, colours)
    if traced:
        _plot_samples(axes[-1], traced)
    _plot_curves(ax_curves, records)
    ax_curves.set_title("learning curves", fontsize="medium")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06 if events else 0, 1, 1))
    out = run / REPORT_FILE
    fig.savefig(out, dpi=100)
    return out


def _last_traced(run: Path, k: int = 4) -> list[TraceRecord]:
    """Up to ``k`` samples of the last step in the run's rollout trace (none without a trace)."""
    from asyncrl.telemetry import trace

    if not (run / trace.TRACE_FILE).is_file():
        return []
    recs = trace.read(run)
    last = max((r.step for r in recs), default=None)
    return [r for r in recs if r.step == last][:k]


def _plot_samples(ax: Axes, recs: list[TraceRecord]) -> None:
    """The traced samples side by side with their rewards, as text."""
    ax.axis("off")
    ax.set_title(f"traced samples, step {recs[0].step} (asyncrl trace RUN_DIR)", fontsize="medium")
    lines = [
        f"reward {r.reward:<5g} staleness {r.staleness}  {r.prompt_text[-40:]!r} -> {r.response_text[:50]!r}"
        for r in recs
    ]
    ax.text(0.0, 1.0, "\n".join(lines), family="monospace", fontsize="small", va="top", transform=ax.transAxes)


def _step_window(events: list[Event], first: int, last: int) -> list[Event]:
    """The events inside the driver's steps ``first..last`` (by time, so worker spans without a step count too)."""
    steps = [
        e
        for e in events
        if e["worker"] == "driver" and e["name"] == "step" and e["step"] is not None and first <= e["step"] <= last
    ]
    if not steps:
        raise ValueError(f"compare_report: no driver step spans for steps {first}..{last}")
    t0, t1 = min(e["start_s"] for e in steps), max(e["end_s"] for e in steps)
    return [e for e in events if e["end_s"] > t0 and e["start_s"] < t1]


def compare_report(
    run_dirs: list[str | os.PathLike[str]],
    out_png: str | os.PathLike[str],
    steps: tuple[int, int] | None = None,
) -> Path:
    """Stack the Gantt charts of several runs on a shared x axis (seconds since each run's own start, or since the
    start of step ``steps[0]`` when a window of steps ``(first, last)`` is given).

    Span colours are shared across runs, so "generate" is the same colour in the ``sync`` and ``one_step_off``
    panels. Every run needs a ``timeline.json``; a missing one raises naming the path.
    """
    if not run_dirs:
        raise ValueError("compare_report: run_dirs is empty")
    runs: list[tuple[str, list[Event]]] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / TIMELINE_FILE
        if not path.exists():
            raise FileNotFoundError(f"compare_report: no {TIMELINE_FILE} at {path}")
        events = read_chrome_trace(path)
        runs.append((Path(run_dir).resolve().name, _step_window(events, *steps) if steps else events))

    colours = _colours(sorted({n for _, events in runs for n in _span_names(events)}))
    heights = [max(1.5, 0.6 * len({e["worker"] for e in events})) for _, events in runs]
    fig = _figure(12, 1.5 + sum(heights))
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    longest_s = 0.0
    for ax, (name, events) in zip(axes[:, 0], runs):
        longest_s = max(longest_s, _plot_gantt(ax, events, colours))
        ax.set_title(name, fontsize="medium")
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    if steps:
        axes[-1, 0].set_xlabel(f"seconds since step {steps[0]} began")
    axes[0, 0].set_xlim(0, longest_s * 1.02 or 1.0)
    _legend(fig, colours)
    fig.suptitle("timeline comparison")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
