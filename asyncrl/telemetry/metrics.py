"""One entry point for per-step scalar metrics, fanned out to the configured backends.

The driver calls :meth:`MetricsLogger.log` once per training step with a flat ``{"reward/mean": 0.5, ...}`` dict
(the names and units: docs/metrics.md); the console line and the bundled Grafana dashboard read ``reward/mean``,
``val/accuracy``, ``timing_s/*``, ``perf/throughput_tokens_per_s`` and ``staleness/*``. Values are validated once here
(numbers only, so a stray string or tensor fails at the call site with the key named, not deep inside a backend), then
every backend gets the same ``dict[str, float]`` and the same timestamp.
"""

from __future__ import annotations

import numbers
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from asyncrl.config.schema import LOGGERS, TrainerConfig
from asyncrl.telemetry.backends import (
    ConsoleBackend,
    JsonlWriter,
    PrometheusBackend,
    TensorBoardBackend,
    last_logged_step,
    read_metrics,
)
from asyncrl.telemetry.trackers import MlflowBackend, RunInfo, WandbBackend

__all__ = ["ALLOWED_BACKENDS", "MetricsLogger", "last_logged_step", "machine_cpu", "merge_metrics", "read_metrics"]

ALLOWED_BACKENDS: tuple[str, ...] = LOGGERS  # trainer.logger's choices
RESERVED_KEYS = frozenset({"step", "time"})  # the jsonl record's own fields
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def machine_cpu() -> dict[str, float]:
    """``perf/machine_busy_core_s`` (``/proc/stat``: user, nice, system, irq, softirq, steal) and ``perf/monotonic_s``
    (docs/metrics.md); every process counts, so it means something only on an otherwise idle machine. Empty where
    there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return {}
    if not fields or fields[0] != "cpu":
        return {}
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return {"perf/machine_busy_core_s": float(busy), "perf/monotonic_s": time.monotonic()}


def validate_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """Metrics as ``{str: float}``, NaN/inf kept (each backend decides how to store them). Real numbers, numpy
    scalars and 0-d arrays/tensors pass; anything else is an error naming its key."""
    if not isinstance(metrics, dict):
        raise ValueError(f"MetricsLogger.log: metrics must be a dict, got {type(metrics).__name__}")
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"MetricsLogger.log: metric keys must be non-empty strings, got {key!r}")
        if key in RESERVED_KEYS:
            raise ValueError(f"MetricsLogger.log: metric key {key!r} is reserved (the record's own {key!r} field)")
        number = value.item() if getattr(value, "ndim", None) == 0 and hasattr(value, "item") else value
        if not isinstance(number, numbers.Real):
            raise ValueError(
                f"MetricsLogger.log: metric {key!r} must be a real number, got {type(value).__name__}: {value!r}"
            )
        clean[key] = float(number)
    return clean


class MetricsLogger:
    """Logs per-step scalars to the ``backends`` (docs/metrics.md, "Loggers"), their files under ``out_dir``.

    ``prometheus_port`` 0 or None picks a free port, available afterwards as :attr:`prometheus_port`. W&B and MLflow
    record ``run`` (default: named after ``out_dir``). ``console=False`` silences the console backend even when it is
    listed, so Ray workers or tests can share a config with the driver without printing. Thread-safe: one lock
    serialises ``log`` calls, so lines never interleave.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        backends: list[str],
        run_name: str = "",
        prometheus_port: int | None = None,
        console: bool = True,
        run: RunInfo | None = None,
    ) -> None:
        unknown = [b for b in backends if b not in ALLOWED_BACKENDS]
        if unknown:
            raise ValueError(f"MetricsLogger: unknown backend(s) {unknown}; allowed: {list(ALLOWED_BACKENDS)}")
        self.out_dir = Path(out_dir)
        self.backends: list[str] = list(dict.fromkeys(backends))
        self.prometheus_port: int | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._sinks: list[JsonlWriter | TensorBoardBackend | PrometheusBackend | ConsoleBackend] = []  # in log order
        self._console: ConsoleBackend | None = None
        self.trackers: dict[str, WandbBackend | MlflowBackend] = {}
        run = run or RunInfo(project=TrainerConfig.project_name, name=run_name or self.out_dir.name)
        try:
            if "jsonl" in self.backends:
                self._sinks.append(JsonlWriter(self.out_dir / METRICS_FILE))
            if "tensorboard" in self.backends:
                self._sinks.append(TensorBoardBackend(self.out_dir / TENSORBOARD_DIR))
            if "prometheus" in self.backends:
                self._sinks.append(prometheus := PrometheusBackend(prometheus_port or 0, run_name))
                self.prometheus_port = prometheus.port
            if "console" in self.backends and console:
                self._console = ConsoleBackend(run_name)
                self._sinks.append(self._console)
            if "wandb" in self.backends:
                self.trackers["wandb"] = WandbBackend(self.out_dir, run)
            if "mlflow" in self.backends:
                self.trackers["mlflow"] = MlflowBackend(self.out_dir, run)
        except BaseException:
            self.close()  # do not leak a bound port or open files when a later backend fails
            raise

    def set_total(self, total_steps: int) -> None:
        """Total training steps, for the console progress bar (no bar when stdout is not a terminal)."""
        if not isinstance(total_steps, int) or total_steps < 0:
            raise ValueError(f"MetricsLogger.set_total: total_steps must be a non-negative int, got {total_steps!r}")
        if self._console is not None:
            self._console.set_total(total_steps)

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        """Record ``metrics`` for training ``step`` in every backend; returns once the jsonl line is on disk."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"MetricsLogger.log: step must be a non-negative int, got {step!r}")
        step = int(step)
        clean = validate_metrics(metrics)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"MetricsLogger({self.out_dir}): log(step={step}) after close()")
            walltime_s = time.time()
            for sink in self._sinks:  # the jsonl line first: on disk before anything else sees the step
                sink.log(step, clean, walltime_s)
            for tracker in self.trackers.values():
                tracker.log(step, clean, walltime_s)

    def close(self, failed: bool = False) -> None:
        """Flush and release everything (files, the Prometheus port, the progress bar, the trackers' runs, marked
        failed when ``failed``: the run stopped on an error). Safe to call twice."""
        with self._lock:
            self._closed = True
            sinks, self._sinks, self._console = self._sinks, [], None
            for sink in reversed(sinks):
                sink.close()
            trackers, self.trackers = self.trackers, {}
            for tracker in trackers.values():
                tracker.close(failed)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Several workers' metrics of one step as one (their generation and their reward metrics): counts summed, maxima
    maxed, the rest averaged."""
    out: dict[str, float] = {}
    for key in sorted({k for p in parts for k in p}):
        values = [p[key] for p in parts if key in p]
        if key.endswith(("_count", "timeouts")):
            out[key] = float(sum(values))
        elif key.endswith("_max") or key.endswith("_max_s"):
            out[key] = float(max(values))
        else:
            out[key] = sum(values) / len(values)
    return out
