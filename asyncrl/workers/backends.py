"""The in-process role backend: workers as objects in the driver's process (the Ray one is ``RayHandle`` in
``asyncrl.workers.cluster``, the only module that imports Ray, so an in-process run never loads it).

Both backends start the same worker classes with the same arguments and hand back ``asyncrl.calls.Handle``s.
In-process, each worker gets its own call thread (``concurrency`` threads for a worker that must answer while it
works, like the Rollouter), so calls to one worker run one at a time and calls to different workers overlap, as with
Ray actors; torch releases the GIL inside its kernels, so a rollout worker's decode and the trainer's update really do
run at once. What in-process does not give: CPU reservations (every worker shares the process's torch threads) and
isolation (a worker that crashes the interpreter takes the run with it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asyncrl.calls import wait_with_deadline
from asyncrl.comm.groups import LOOPBACK
from asyncrl.comm.transport import WorkerLocation


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
        return WorkerLocation(
            name=self.name,
            address=LOOPBACK,
            node_id="local",
            gpu_ids=(),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            device=str(getattr(self.obj, "device", "cpu")),
            pid=os.getpid(),
        )
