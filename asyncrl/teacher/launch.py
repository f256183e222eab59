"""Start, supervise and stop a teacher server process for a distillation run (``teacher.url`` empty).

The server is ``python -m asyncrl.teacher.server`` on 127.0.0.1 with a free port, a separate process (as a ``vllm
serve`` would be) that prints one JSON line with its URL when it listens. The run stops it at the end, on an error and
on SIGTERM/Ctrl-C (the context manager's ``finally``); a server that exits or stays silent during start-up is an error
that names the model directory and carries the tail of the server's stderr.

:class:`TeacherSupervisor` restarts a server that dies on its port, so the client's URL stays valid; the client waits
out a restart before each retry (``wait_up``), so ``teacher.max_retries`` are spent on a server that is up, not on a
start-up longer than the back-off. What it survives and how it gives up (``teacher.max_restarts``): docs/faults.md.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from asyncrl.config import TeacherConfig, check
from asyncrl.errors import UserInputError

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often the supervisor looks at the server process (seconds): the most a death goes unseen


class TeacherStartError(UserInputError, RuntimeError):
    """The teacher server started here did not come up."""


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to start the teacher server again the same way (a restart differs only in the port)."""

    model_dir: str
    stderr_path: Path  # appended to by every start, so one file tells the server's whole story
    max_batch: int
    threads: int
    startup_timeout_s: float


@dataclass(frozen=True)
class TeacherRestart:
    """One death of the server started here and the restart that followed it."""

    died_at: float  # unix seconds, when the supervisor saw the exit (at most POLL_S after it)
    exit_code: int  # the dead process's; negative = killed by that signal (-9: SIGKILL)
    pid: int | None  # the new server's process; None when it failed to start (that counts as the next death)
    start_s: float  # seconds from seeing the death to the new server listening (or failing to)


@contextmanager
def teacher_endpoint(cfg: TeacherConfig, log_dir: str | os.PathLike[str]) -> Iterator[TeacherEndpoint]:
    """The teacher's URL: ``cfg.url`` as given, or that of a server started here on ``cfg.model_path``, supervised
    (restarted on its port up to ``cfg.max_restarts`` times) and stopped at exit."""
    if cfg.url:
        yield TeacherEndpoint(cfg.url)
        return
    check(Path(str(cfg.model_path)).is_dir(), "teacher.model_path", cfg.model_path, "an existing model directory")
    spec = ServerSpec(
        str(cfg.model_path),
        Path(log_dir) / "teacher_server.log",
        cfg.server_max_batch,
        cfg.server_threads,
        cfg.startup_timeout_s,
    )
    proc = _spawn(spec, port=0)
    supervisor = TeacherSupervisor(spec, proc, _await_url(proc, spec), cfg.max_restarts)
    try:
        yield supervisor
    finally:
        supervisor.stop()


class TeacherEndpoint:
    """Where the teacher answers: a given ``teacher.url``, not ours to restart or wait for; a server started here is
    a :class:`TeacherSupervisor`, which says what happened to it."""

    gave_up: str | None = None  # why the server is no longer restarted (it died more than teacher.max_restarts times)

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def pid(self) -> int | None:
        """The server process started here now (a restart changes it); none for a given ``teacher.url``."""
        return None

    @property
    def restarts(self) -> list[TeacherRestart]:
        return []

    def wait_up(self, timeout_s: float) -> bool:
        return True


class TeacherSupervisor(TeacherEndpoint):
    """Restarts the server started here on its port when it exits while the run still needs it; a restart that fails
    to start counts as the next death, and on exit the supervisor stops before the server, which is never restarted.

    Threading: one daemon thread (``_watch``) polls and restarts; ``stop`` may come from any thread at any moment, a
    restart in progress included. ``_lock`` orders the two: after ``stop`` has set ``_stopping`` under it, no new
    process is spawned, so the process ``stop`` ends last is the final one.
    """

    def __init__(self, spec: ServerSpec, proc: subprocess.Popen, url: str, max_restarts: int) -> None:
        port = urlsplit(url).port
        if not port:
            stop_process(proc)
            raise TeacherStartError(f"teacher server for {spec.model_dir} reported {url!r}, a URL without a port")
        super().__init__(url)
        self.spec, self.port, self.max_restarts = spec, port, max_restarts
        self._proc = proc
        self._restarts: list[TeacherRestart] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._up = threading.Event()  # clear from a death seen until the restart listens (or none will come)
        self._up.set()
        self._thread = threading.Thread(target=self._watch, name="teacher-supervisor", daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        with self._lock:
            return self._proc.pid

    @property
    def restarts(self) -> list[TeacherRestart]:
        with self._lock:
            return list(self._restarts)

    def wait_up(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) while the server is being restarted; True when one listens. The client calls
        this before each retry, so its retries are spent on a server that is up, not on the restart's start-up."""
        with self._lock:
            dead_unseen = self._proc.poll() is not None and self._up.is_set()
        if dead_unseen:  # the watcher sees the exit within one poll
            self._stopping.wait(2 * POLL_S)
        return self._up.wait(timeout_s)

    def stop(self) -> None:
        """Stop watching, then stop the server (one still starting included); nothing is restarted after this."""
        with self._lock:
            self._up.set()  # nobody waits for a restart any more
            self._stopping.set()
            proc = self._proc
        stop_process(proc)  # a restart waiting for this one's URL sees it exit and gives up at once
        self._thread.join()
        stop_process(self._proc)  # the final process: the thread may have started it before _stopping was set

    def _watch(self) -> None:
        while not self._stopping.wait(POLL_S):
            with self._lock:
                proc = self._proc
            code = proc.poll()
            if code is None:
                continue
            self._up.clear()
            if not self._restart(code):
                self._up.set()  # given up (or stopping): a waiting client fails on its next try
                return
            if self._restarts[-1].pid is not None:
                self._up.set()

    def _restart(self, code: int) -> bool:
        """Start a server on the port after the last one exited with ``code``; False once no more are started."""
        died_at, t0 = time.time(), time.monotonic()
        deaths = len(self._restarts) + 1
        if deaths > self.max_restarts:
            times = "once" if deaths == 1 else f"{deaths} times"
            self.gave_up = (
                f"the teacher server started here for {self.spec.model_dir} died {times}, more than "
                f"teacher.max_restarts={self.max_restarts}, and is not restarted again (last exit code {code}; "
                f"its stderr: {self.spec.stderr_path})"
            )
            logger.error("%s", self.gave_up)
            return False
        logger.warning(
            "teacher server at %s exited with code %d; restarting it on port %d (restart %d of at most %d; stderr: %s)",
            self.url,
            code,
            self.port,
            deaths,
            self.max_restarts,
            self.spec.stderr_path,
        )
        with self._lock:
            if self._stopping.is_set():
                return False
            _note(self.spec.stderr_path, f"exited with code {code}; restart {deaths} of {self.max_restarts}")
            try:
                proc = self._proc = _spawn(self.spec, self.port)
            except OSError as e:
                self.gave_up = f"the teacher server for {self.spec.model_dir} could not be started again: {e}"
                logger.error("%s", self.gave_up)
                return False
        pid: int | None = proc.pid
        try:
            url = _await_url(proc, self.spec)
            if url != self.url:
                stop_process(proc)
                raise TeacherStartError(f"restarted teacher server reported {url}, not {self.url}")
        except TeacherStartError as e:
            if self._stopping.is_set():
                return False
            logger.warning("teacher server restart %d of %d failed: %s", deaths, self.max_restarts, e)
            pid = None
        took = time.monotonic() - t0
        if pid is not None:
            logger.warning("teacher server restarted at %s (pid %d) in %.1f s", self.url, pid, took)
        with self._lock:
            self._restarts.append(TeacherRestart(died_at, code, pid, took))
        return True


def start_teacher_server(
    model_dir: str, stderr_path: Path, max_batch: int, threads: int, startup_timeout_s: float, port: int = 0
) -> tuple[subprocess.Popen, str]:
    """Start ``asyncrl serve-teacher`` on 127.0.0.1 (``port`` 0: a free one); return the process and its URL once it
    listens. Not supervised: the caller stops it (:func:`stop_process`)."""
    spec = ServerSpec(model_dir, stderr_path, max_batch, threads, startup_timeout_s)
    proc = _spawn(spec, port)
    return proc, _await_url(proc, spec)


def _spawn(spec: ServerSpec, port: int) -> subprocess.Popen:
    spec.stderr_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "asyncrl.teacher.server", "--model", spec.model_dir, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--max-batch", str(spec.max_batch), "--threads", str(spec.threads)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(spec.threads)}
    err = open(spec.stderr_path, "ab")  # noqa: SIM115 (the child holds it for its whole life)
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
    finally:
        err.close()


def _await_url(proc: subprocess.Popen, spec: ServerSpec) -> str:
    """The URL from the server's first stdout line; stops the process and raises if it does not come."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(spec.startup_timeout_s)
    where = f"teacher server for {spec.model_dir} (stderr: {spec.stderr_path})"
    if not line or not line[0].strip():
        stop_process(proc)
        status = f"did not start within {spec.startup_timeout_s:.0f} s" if not line else "exited during start-up"
        try:
            tail = spec.stderr_path.read_text(errors="replace")[-1500:].strip() or "(empty)"
        except OSError:
            tail = "(no stderr file)"
        raise TeacherStartError(f"{where} {status}: {tail}")
    try:
        return json.loads(line[0])["teacher"]
    except (ValueError, KeyError, TypeError):
        stop_process(proc)
        raise TeacherStartError(f"{where}: unexpected first line {line[0]!r}") from None


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


def _note(path: Path, what: str) -> None:
    """A line of our own in the server's stderr log, so the log shows where one server ended and the next began."""
    try:
        with open(path, "a") as f:
            f.write(f"--- asyncrl {time.strftime('%Y-%m-%d %H:%M:%S')}: teacher server {what} ---\n")
    except OSError:
        pass
