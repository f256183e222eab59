"""Observability for asyncrl runs: per-step metrics (``metrics``, its ``backends`` and ``trackers``), per-worker span
timelines (``timeline``), the rollout trace (``trace``) and PNG reports (``report``, imported lazily: matplotlib is not
needed in workers); ``GRAFANA_DASHBOARD``, a dashboard for the prometheus backend.
"""

from collections.abc import Callable
from pathlib import Path

from asyncrl.telemetry.backends import sanitize_metric_name
from asyncrl.telemetry.metrics import ALLOWED_BACKENDS, MetricsLogger, last_logged_step, read_metrics
from asyncrl.telemetry.timeline import (
    Timeline,
    get_timeline,
    idle_fraction,
    read_chrome_trace,
    span_totals,
    write_chrome_trace,
)

GRAFANA_DASHBOARD: Path = Path(__file__).parent / "grafana" / "asyncrl_dashboard.json"

__all__ = [
    "ALLOWED_BACKENDS",
    "GRAFANA_DASHBOARD",
    "MetricsLogger",
    "Timeline",
    "compare_report",
    "get_timeline",
    "idle_fraction",
    "last_logged_step",
    "read_chrome_trace",
    "read_metrics",
    "sanitize_metric_name",
    "span_totals",
    "write_chrome_trace",
    "write_report",
]


def __getattr__(name: str) -> Callable[..., Path]:
    """Import the matplotlib-based report functions only when they are asked for."""
    if name in ("write_report", "compare_report"):
        from asyncrl.telemetry import report

        return getattr(report, name)
    raise AttributeError(f"module 'asyncrl.telemetry' has no attribute {name!r}")
