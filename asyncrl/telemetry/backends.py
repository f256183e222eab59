"""Metric sinks behind :class:`asyncrl.telemetry.metrics.MetricsLogger`: TensorBoard, Prometheus, console, and the
crash-safe JSON-lines file every run writes.

Each backend receives already-validated ``dict[str, float]`` values (NaN/inf included) and decides what to do with
non-finite ones itself: TensorBoard and Prometheus skip them, so a single bad step does not wreck a plot's y-range or
fire an alert on a meaningless value. Heavy imports (torch's SummaryWriter) happen only when a backend is chosen.

A run can be killed at any moment, so the JSON-lines file's every line is on disk before ``log`` returns; the only
damage a kill can do is a torn last line, which readers ignore and :class:`JsonlWriter` cuts off when it reopens the
file, so it stays valid JSON lines across crash/resume cycles.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from prometheus_client import Gauge
    from rich.progress import Progress, TaskID

METRIC_PREFIX = "asyncrl_"
GRAFANA_DASHBOARD = Path(__file__).parent / "grafana" / "asyncrl_dashboard.json"  # for the prometheus backend
_INVALID_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_metric_name(key: str) -> str:
    """Prometheus name for a metric key: ``reward/mean`` -> ``asyncrl_reward_mean``.

    Every character outside ``[a-zA-Z0-9_]`` becomes ``_`` (no collapsing, so the mapping is easy to predict when
    writing Grafana queries); the prefix keeps names valid even when a key starts with a digit.
    """
    return METRIC_PREFIX + _INVALID_CHARS.sub("_", key)


class TensorBoardBackend:
    """Scalars to ``log_dir`` via torch's SummaryWriter, flushed every step so a crash loses nothing already logged."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, float], walltime_s: float) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self._writer.add_scalar(key, value, global_step=step, walltime=walltime_s)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class PrometheusBackend:
    """One gauge per metric key, served on ``http://127.0.0.1:<port>/metrics`` from a daemon thread.

    Uses a private registry, so several loggers in one process (tests, sweeps) do not collide on metric names. The
    run name goes into an info metric (``asyncrl_run_info{run="..."} 1``) rather than a label on every gauge, so
    dashboard queries stay plain metric names. ``port=0`` lets the OS pick a free port; read it back from ``.port``.
    """

    def __init__(self, port: int, run_name: str = "") -> None:
        from prometheus_client import CollectorRegistry, Gauge, Info, start_http_server

        self._gauge_cls = Gauge
        self._registry = CollectorRegistry(auto_describe=True)
        self._gauges: dict[str, tuple[str, Gauge]] = {}  # sanitised name -> the metric key that claimed it, its gauge
        self._step = Gauge(METRIC_PREFIX + "step", "Last logged training step", registry=self._registry)
        if run_name:
            Info(METRIC_PREFIX + "run", "Name of the asyncrl run", registry=self._registry).info({"run": run_name})
        try:
            self._server, self._thread = start_http_server(port, addr="127.0.0.1", registry=self._registry)
        except OSError as e:
            raise OSError(f"prometheus backend: cannot serve metrics on 127.0.0.1:{port}: {e}") from e
        self.port: int = int(self._server.server_port)

    def _gauge(self, key: str) -> Gauge:
        name = sanitize_metric_name(key)
        if name not in self._gauges:
            try:
                self._gauges[name] = (key, self._gauge_cls(name, f"asyncrl metric {key}", registry=self._registry))
            except ValueError as e:
                raise ValueError(f"prometheus backend: cannot register gauge {name!r} for key {key!r}: {e}") from e
        owner, gauge = self._gauges[name]
        if owner != key:
            raise ValueError(f"prometheus backend: metric keys {owner!r} and {key!r} both map to {name!r}")
        return gauge

    def log(self, step: int, metrics: dict[str, float], walltime_s: float) -> None:
        self._step.set(step)
        for key, value in metrics.items():
            gauge = self._gauge(key)  # registered even when non-finite, so the name is known to collide early
            if math.isfinite(value):
                gauge.set(value)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


_CONSOLE_FIELDS = (  # metric key, its label, the format of a finite value (a non-finite one shows as nan/inf)
    ("reward/mean", "reward {}", "{:.4g}"),
    ("val/accuracy", "val_acc {}", "{:.4g}"),
    ("timing_s/step", "time {}", "{:.2f}s"),
    ("perf/throughput_tokens_per_s", "{} tok/s", "{:,.0f}"),
)


def format_console_line(step: int, metrics: dict[str, float], run_name: str = "", total: int | None = None) -> str:
    """The short per-step summary: step, reward, validation accuracy, step time (s), throughput (tokens/s).

    Only keys that are present appear, so early steps without validation just omit it.
    """
    parts = [f"[{run_name}]"] if run_name else []
    parts.append(f"step {step}" + (f"/{total}" if total else ""))
    for key, label, fmt in _CONSOLE_FIELDS:
        if key in metrics:
            value = metrics[key]
            parts.append(label.format(fmt.format(value) if math.isfinite(value) else value))
    return "  ".join(parts)


class ConsoleBackend:
    """Prints :func:`format_console_line` per step via rich; optionally keeps a progress bar under it.

    The progress bar only exists when stdout is a terminal: in log files and CI output a bar is a mess of carriage
    returns, so there :meth:`set_total` only makes lines show ``step k/total``.
    """

    def __init__(self, run_name: str = "") -> None:
        from rich.console import Console

        self.run_name = run_name
        self.total: int | None = None
        self._console = Console(highlight=False, soft_wrap=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def set_total(self, total_steps: int) -> None:
        self.total = total_steps
        if not self._console.is_terminal:
            return
        if self._progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self._console,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.run_name or "train", total=total_steps)
        elif self._task is not None:
            self._progress.update(self._task, total=total_steps)

    def log(self, step: int, metrics: dict[str, float], walltime_s: float) -> None:
        self._console.print(format_console_line(step, metrics, self.run_name, self.total), markup=False)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


_BLOCK = 64 * 1024  # bytes read per step when scanning backwards for the last line


def _parse_line(raw: bytes) -> dict[str, float | None] | None:
    """The JSON object on one line, or None when the bytes are not a JSON object (torn, zero-filled, garbage)."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _last_line_offset(f: BinaryIO, size: int) -> int:
    """Byte offset at which the file's last line starts; its own terminating newline does not count as a break."""
    f.seek(size - 1)
    end = size - 1 if f.read(1) == b"\n" else size
    pos = end
    while pos > 0:
        start = max(0, pos - _BLOCK)
        f.seek(start)
        block = f.read(pos - start)
        i = block.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def repair_jsonl_tail(path: str | os.PathLike[str]) -> bool:
    """Make ``path`` valid JSON lines again after a crash; returns True when the file was changed.

    A last line that is not a JSON object is truncated away; a last line that is valid but lost its newline (the kill
    hit between the object and ``\\n``) gets the newline back. Missing or empty files are left alone.
    """
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return False
    with open(p, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        offset = _last_line_offset(f, size)
        f.seek(offset)
        tail = f.read()
        if tail.strip() == b"":
            return False
        if _parse_line(tail) is None:
            f.truncate(offset)
        elif not tail.endswith(b"\n"):
            f.write(b"\n")
        else:
            return False
        f.flush()
        os.fsync(f.fileno())
    return True


class JsonlWriter:
    """Appends one ``{"step", "time", ...}`` object per step to ``path``, durable line by line (flush + fsync).

    Opening repairs a torn tail left by a previous crash (see :func:`repair_jsonl_tail`). Not thread-safe on its own:
    :class:`asyncrl.telemetry.metrics.MetricsLogger` serialises calls.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_jsonl_tail(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # closed in close()

    def log(self, step: int, metrics: dict[str, float], walltime_s: float) -> None:
        """Non-finite values are written as ``null`` (JSON has no NaN/inf)."""
        record = {"step": step, "time": walltime_s, **{k: v if math.isfinite(v) else None for k, v in metrics.items()}}
        self._file.write(json.dumps(record, allow_nan=False, separators=(", ", ": ")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float | None]]:
    """All records of a metrics JSON-lines file, in file order.

    Blank lines are skipped and a final line that is not a JSON object (torn by a crash) is ignored. A bad line
    *before* the last one is real corruption, not a crash artefact, and raises ValueError naming the file and line.
    Non-finite values were written as ``null`` and come back as None.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"read_metrics: no metrics file at {p}")
    lines = p.read_bytes().split(b"\n")
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    records: list[dict[str, float | None]] = []
    for k, (lineno, raw) in enumerate(numbered):
        record = _parse_line(raw)
        if record is None:
            if k == len(numbered) - 1:
                break  # torn last line from a crash
            raise ValueError(f"read_metrics: {p} line {lineno} is not a JSON object: {raw[:80]!r}")
        records.append(record)
    return records


def last_logged_step(path: str | os.PathLike[str]) -> int | None:
    """Step of the last complete record in ``path``, or None when the file is missing or holds no record.

    Used on resume to tell which steps already reached the log (a torn last line does not count).
    """
    p = Path(path)
    if not p.exists():
        return None
    for record in reversed(read_metrics(p)):
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None
