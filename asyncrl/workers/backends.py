"""The two role backends: Ray actors (the default; multi-node by Ray's means) and workers in the driver's process.

Both start the same worker classes with the same arguments and hand back ``asyncrl.calls.Handle``s. In-process, each
worker gets its own call thread (``concurrency`` threads for a worker that must answer while it works, like the
Rollouter), so calls to one worker run one at a time and calls to different workers overlap, as with Ray actors;
torch releases the GIL inside its kernels, so a rollout worker's decode and the trainer's update really do run at
once. What in-process does not give: CPU reservations (every worker shares the process's torch threads) and
isolation (a worker that crashes the interpreter takes the run with it).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray


class RayPending:
    def __init__(self, ref: Any):
        self.ref = ref

    def result(self, timeout: float | None = None) -> Any:
        return ray.get(self.ref, timeout=timeout)

    def done(self) -> bool:
        ready, _ = ray.wait([self.ref], timeout=0)
        return bool(ready)


class RayHandle:
    """A Ray actor."""

    def __init__(self, actor: Any, name: str):
        self.actor, self.name = actor, name

    def call(self, method: str, *args: Any, **kwargs: Any) -> RayPending:
        return RayPending(getattr(self.actor, method).remote(*args, **kwargs))

    def kill(self) -> None:
        ray.kill(self.actor)


class LocalPending:
    def __init__(self, future: Future):
        self.future = future

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout=timeout)

    def done(self) -> bool:
        return self.future.done()


class LocalHandle:
    """A worker object in this process, called on its own thread(s)."""

    def __init__(self, obj: Any, name: str, concurrency: int = 1):
        self.obj, self.name = obj, name
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix=name)

    def call(self, method: str, *args: Any, **kwargs: Any) -> LocalPending:
        return LocalPending(self.pool.submit(getattr(self.obj, method), *args, **kwargs))

    def kill(self) -> None:
        """Stop taking calls; a call still running finishes on its thread (a thread cannot be killed)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
