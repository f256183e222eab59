"""Start and stop a teacher server process for a distillation run (``teacher.url`` empty).

The server is ``python -m asyncrl.distill.server`` on 127.0.0.1 with a free port, a real separate process (as a
``vllm serve`` would be); it prints one JSON line with its URL when it listens. The run stops it at the end, on an
error and on SIGTERM/Ctrl-C (the context manager's ``finally``); a server that exits or stays silent during start-up
is an error that names the model directory and carries the tail of the server's stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config import TeacherConfig, check


class TeacherStartError(RuntimeError):
    """The teacher server started here did not come up."""


@dataclass(frozen=True)
class TeacherEndpoint:
    url: str
    pid: int | None  # the server process started here; None for a given ``teacher.url``


@contextmanager
def teacher_endpoint(cfg: TeacherConfig, log_dir: str | os.PathLike[str]) -> Iterator[TeacherEndpoint]:
    """The teacher's URL: ``cfg.url`` as given, or that of a server started here on ``cfg.model_path`` (stopped at
    exit)."""
    if cfg.url:
        yield TeacherEndpoint(cfg.url, None)
        return
    check(Path(str(cfg.model_path)).is_dir(), "teacher.model_path", cfg.model_path, "an existing model directory")
    proc, url = start_teacher_server(
        str(cfg.model_path),
        Path(log_dir) / "teacher_server.log",
        max_batch=cfg.server_max_batch,
        threads=cfg.server_threads,
        startup_timeout_s=cfg.startup_timeout_s,
    )
    try:
        yield TeacherEndpoint(url, proc.pid)
    finally:
        stop_process(proc)


def start_teacher_server(
    model_dir: str, stderr_path: Path, max_batch: int, threads: int, startup_timeout_s: float
) -> tuple[subprocess.Popen, str]:
    """Start ``asyncrl serve-teacher`` on 127.0.0.1 (free port); return the process and its URL once it listens."""
    stderr_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "asyncrl.distill.server", "--model", model_dir, "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--max-batch", str(max_batch), "--threads", str(threads)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    err = open(stderr_path, "ab")  # noqa: SIM115 (the child holds it for its whole life)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
    err.close()
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(startup_timeout_s)
    where = f"teacher server for {model_dir} (stderr: {stderr_path})"
    if not line or not line[0].strip():
        stop_process(proc)
        status = f"did not start within {startup_timeout_s:.0f} s" if not line else "exited during start-up"
        raise TeacherStartError(f"{where} {status}: {_tail(stderr_path)}")
    try:
        url = json.loads(line[0])["teacher"]
    except (ValueError, KeyError, TypeError):
        stop_process(proc)
        raise TeacherStartError(f"{where}: unexpected first line {line[0]!r}") from None
    return proc, url


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps the child."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip() or "(empty)"
    except OSError:
        return "(no stderr file)"
