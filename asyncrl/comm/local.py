"""``local``: every rank of a group is a thread of this process (the in-process backend). There is no process group:
a broadcast is each receiver copying rank 0's tensor, on the device it lives on (the in-device copy of a trainer and an
engine sharing one GPU, where NCCL would refuse two ranks on one device), with the same deadlines as a real group."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch


class _LocalHub:
    """What the ranks of one in-process group share: each collective's state by its sequence number (every rank
    issues the same collectives in the same order, as with a process group)."""

    _hubs: dict[tuple[str, int, str], _LocalHub] = {}
    _lock = threading.Lock()

    def __init__(self, key: tuple[str, int, str], world_size: int) -> None:
        self.key, self.world = key, world_size
        self.cond = threading.Condition()
        self.ops: dict[int, list[Any]] = {}
        self.aborted = False
        self.left = 0
        self.joined = 0

    def wait_for(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait (holding ``cond``) until ``ready()``; RuntimeError on the deadline or when a rank aborted."""
        end = time.monotonic() + timeout_s
        while not ready():
            if self.aborted:
                raise RuntimeError(f"local group: {what}: a rank aborted the group")
            left = end - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"local group: {what} timed out after {timeout_s:g} s (a peer did not take part)")
            self.cond.wait(left)

    def leave(self, abort: bool) -> None:
        with self.cond:
            self.aborted = self.aborted or abort
            self.left += 1
            self.cond.notify_all()
        if self.left >= self.world or abort:
            with _LocalHub._lock:
                if _LocalHub._hubs.get(self.key) is self:
                    del _LocalHub._hubs[self.key]


class LocalWork:
    """A collective of a local group; ``wait`` does the rank's part (a receiver's copy) and waits for the others."""

    def __init__(self, done: Callable[[float], None]) -> None:
        self._done = done

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._done(timeout.total_seconds() if timeout is not None else 1e9)
        return True


class LocalProcessGroup:
    """One rank's view of a group of threads: ``broadcast`` and ``allreduce`` (sum) with the c10d call shapes this
    module uses, on tensors where they are (a CUDA tensor is copied on its device)."""

    def __init__(self, hub: _LocalHub, rank: int) -> None:
        self.hub, self.rank, self.seq = hub, rank, 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def broadcast(self, tensors: list[torch.Tensor], opts: object = None) -> LocalWork:
        tensor, seq, hub = tensors[0], self._next(), self.hub
        if self.rank == 0:
            with hub.cond:
                hub.ops[seq] = [tensor, hub.world - 1]
                hub.cond.notify_all()

            def sent(timeout_s: float) -> None:
                with hub.cond:
                    hub.wait_for(lambda: hub.ops[seq][1] == 0, timeout_s, f"broadcast {seq} (sending)")
                    del hub.ops[seq]

            return LocalWork(sent)

        def received(timeout_s: float) -> None:
            with hub.cond:
                hub.wait_for(lambda: seq in hub.ops, timeout_s, f"broadcast {seq} (receiving)")
                src = hub.ops[seq][0]
            tensor.copy_(src)  # rank 0 waits until every receiver has copied: its tensor stays as it was
            with hub.cond:
                hub.ops[seq][1] -= 1
                hub.cond.notify_all()

        return LocalWork(received)

    def allreduce(self, tensors: list[torch.Tensor], opts: object = None) -> LocalWork:
        tensor, seq, hub = tensors[0], self._next(), self.hub
        with hub.cond:
            entry = hub.ops.setdefault(seq, [torch.zeros_like(tensor), 0, 0])  # sum, contributed, read
            entry[0] += tensor
            entry[1] += 1
            hub.cond.notify_all()

        def reduced(timeout_s: float) -> None:
            with hub.cond:
                hub.wait_for(lambda: entry[1] == hub.world, timeout_s, f"all-reduce {seq}")
                tensor.copy_(entry[0])
                entry[2] += 1
                if entry[2] == hub.world:
                    del hub.ops[seq]

        return LocalWork(reduced)

    def shutdown(self) -> None:
        self.hub.leave(abort=False)

    def abort(self) -> None:
        self.hub.leave(abort=True)


def join_local(key: tuple[str, int, str], rank: int, world_size: int) -> LocalProcessGroup:
    """Rank ``rank`` of the in-process group ``key`` (host, port, name). A hub every rank already joined belongs to an
    earlier group on the same address (a local group binds no port, so a later ``find_free_port`` may hand the same
    one out again): a new one starts."""
    with _LocalHub._lock:
        hub = _LocalHub._hubs.get(key)
        if hub is None or hub.joined >= hub.world:
            hub = _LocalHub._hubs[key] = _LocalHub(key, world_size)
        if hub.world != world_size:
            raise RuntimeError(f"local group {key}: world size {world_size}, the group has {hub.world}")
        hub.joined += 1
    return LocalProcessGroup(hub, rank)
