"""The in-process role backend: workers as objects in the driver's process, each with its own call thread (the Ray one
is ``RayHandle`` in ``asyncrl.workers.cluster``, the only module that imports Ray, so an in-process run never loads
it). Both start the same worker classes with the same arguments and hand back ``asyncrl.calls.Handle``s; what
in-process gives and does not: docs/design.md, "Backends".

Where a worker's library chatter goes, on either backend (docs/outputs.md): a Ray worker's file descriptors 1 and 2
are pointed at ``RUN_DIR/logs/<worker>.log`` before it is built (:func:`send_output_to`), while asyncrl's own warnings
also reach the console it started with; in-process roles share the driver's descriptors, so their progress bars,
Python warnings and transformers' logger go to ``RUN_DIR/logs/in_process.log`` while they run and are put back when
the roles stop (:func:`in_process_chatter_to`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from asyncrl.calls import wait_with_deadline
from asyncrl.comm.groups import LOOPBACK
from asyncrl.comm.transport import WorkerLocation
from asyncrl.telemetry.timeline import Event, get_timeline


class RoleWorker:
    """What every role worker is given and answers, on either backend: ``num_threads`` torch threads (its slot's,
    ``Placement.slot``), its name, checkpoints (``RoleClient``), and its timeline (the spans the report draws) and
    process id."""

    def __init__(self, name: str, num_threads: int | None) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        self.timeline = get_timeline()
        self.timeline.worker = name

    def save_checkpoint(self, directory: str) -> None:
        """Nothing of its own to save, unless the role says otherwise: a rollout worker's weights are the trainer's
        (re-sent after a resume), a reward model is frozen."""

    def load_checkpoint(self, directory: str) -> int | None:
        return None  # the role keeps no weight version of its own

    def pop_timeline(self) -> list[Event]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()


class LocalPending:
    def __init__(self, future: Future, deadline_s: float | None = None, label: str = ""):
        self.future, self.deadline_s, self.label = future, deadline_s, label

    def result(self, timeout: float | None = None) -> Any:
        return wait_with_deadline(lambda t: self.future.result(timeout=t), timeout, self.deadline_s, self.label)

    def done(self) -> bool:
        return self.future.done()

    def on_done(self, callback: Callable[[], None]) -> None:
        self.future.add_done_callback(lambda _f: callback())


class LocalHandle:
    """A worker object in this process, called on its own thread(s)."""

    def __init__(self, obj: object, name: str, concurrency: int = 1, call_timeout_s: float | None = None):
        self.obj, self.name, self.call_timeout_s = obj, name, call_timeout_s
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix=name)

    def call(self, method: str, *args: Any, **kwargs: Any) -> LocalPending:
        future = self.pool.submit(getattr(self.obj, method), *args, **kwargs)
        return LocalPending(future, self.call_timeout_s, f"{self.name}.{method}")

    def kill(self) -> None:
        """Stop taking calls; a call still running finishes on its thread (a thread cannot be killed)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    def location(self, timeout_s: float | None = None) -> WorkerLocation:
        """This process, on this machine; the worker's device is its own choice (``trainer.device``)."""
        return located(self.obj, self.name, LOOPBACK, "local", ())


def located(worker: object, name: str, address: str, node_id: str, gpu_ids: tuple[str, ...]) -> WorkerLocation:
    """Where ``worker`` runs, asked in its own process: there, its device and pid and the CUDA devices it sees."""
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    return WorkerLocation(name, address, node_id, gpu_ids, cuda, str(getattr(worker, "device", "cpu")), os.getpid())


IN_PROCESS_LOG = "in_process.log"


def send_output_to(path: Path, worker: str) -> None:
    """A Ray worker's output to ``path`` (appended to), as the module docstring says. A file that cannot be opened (a
    node of a multi-node cluster that cannot write the run directory) leaves the output where it was, and says so."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        print(f"{worker}: cannot write its log file ({e}): its output stays on the console", file=sys.stderr)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8")
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if hasattr(sys.stdout, "reconfigure"):  # a killed worker loses no line it printed
        sys.stdout.reconfigure(line_buffering=True)
    print(f"--- {worker} (pid {os.getpid()}) started {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    own = logging.getLogger("asyncrl")
    for stream in (console, sys.stderr):  # sys.stderr now writes to the file
        handler = logging.StreamHandler(stream)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter(f"{worker}: %(levelname)s %(name)s: %(message)s"))
        own.addHandler(handler)
    own.propagate = False  # each warning once on each stream, whatever handlers the root logger has here


@contextmanager
def in_process_chatter_to(path: Path) -> Iterator[None]:
    """In-process roles' chatter to ``path`` (appended to) while in the block, as the module docstring says."""
    from transformers.utils import logging as hf_logging

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", buffering=1, encoding="utf-8") as log:
        log.write(f"--- in-process roles (pid {os.getpid()}) started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        shown = warnings.showwarning
        handler = logging.StreamHandler(log)
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
            warnings.formatwarning(message, category, filename, lineno, line)
        )
        hf_logging.set_tqdm_hook(lambda make, args, kwargs: make(*args, **{**kwargs, "file": log}))
        hf_logging.disable_default_handler()
        hf_logging.add_handler(handler)
        try:
            yield
        finally:
            hf_logging.remove_handler(handler)
            hf_logging.enable_default_handler()
            hf_logging.set_tqdm_hook(None)
            warnings.showwarning = shown
