"""``python -m asyncrl.workers.reaper DRIVER_PID``: once the driver is gone, kill every process it had started.

A driver killed with SIGKILL cannot stop its local Ray cluster, and some of Ray's processes outlive it (measured:
``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` still ran 30 s after the driver was killed). ``init_ray`` starts
this watchdog beside a local cluster, in a session of its own so a kill of the driver's process group does not take
it too. It records the driver's descendants (with their start times, so a reused pid is never touched) until it is
re-parented, then sends SIGKILL to those still alive and to their own descendants.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}  # parent pid -> its children's, from one pass over /proc
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            children.setdefault(st[0], []).append(int(d.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            out.append(c)
            todo.append(c)
    return out


def watch(driver: int) -> list[int]:
    """Wait for ``driver`` (this process's parent) to go, then kill what it started; returns the pids killed."""
    me, known = os.getpid(), {}
    while os.getppid() == driver:
        for pid in descendants([driver]):
            st = _stat(pid)
            if pid != me and st is not None:
                known.setdefault(pid, st[1])
        time.sleep(POLL_S)
    live = [p for p, start in known.items() if (_stat(p) or (0, -1))[1] == start]
    targets = set(live) | {p for p in descendants(live) if p != me}
    killed = []
    for pid in sorted(targets):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def start_reaper() -> None:
    """Start the watchdog for this process (Linux only: it reads /proc)."""
    import subprocess

    if not Path("/proc/self/stat").exists():
        return
    subprocess.Popen(
        [sys.executable, "-m", "asyncrl.workers.reaper", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]))
