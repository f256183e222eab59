"""Process groups of their own (a ``TCPStore`` hosted by rank 0 + ``ProcessGroupGloo`` on CPU or ``ProcessGroupNCCL``
on CUDA, called directly), never torch.distributed's default group: a process has one default group, which the
trainer may need for its own data parallelism (FSDP2), while a Ray actor process may take part in several groups over
a run (a weight-sync group is re-created after a failure). Any number of these can coexist in one process.

Every collective here is started asynchronously and waited with a deadline, so a peer that never shows up makes
the call raise (RuntimeError from c10d) after the remaining time instead of blocking forever. ``local``
(``comm.local``): every rank is a thread of this process, and there is no process group at all.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"
LOCAL = "local"  # the ranks are threads of one process: no process group, a copy from rank 0's tensor


def find_free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it; another process could still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# rank 0 takes its reservation as its set-up call starts (seconds later, or a trainer step later): one not taken in
# this time belongs to a set-up that failed
RESERVE_HOLD_S = 900.0
# (host, port) -> rank 0's store, listening since reserve_port, and the monotonic time it is released unless taken
_RESERVED: dict[tuple[str, int], tuple[dist.TCPStore, float]] = {}


def reserve_port(host: str = LOOPBACK, hold_s: float = RESERVE_HOLD_S) -> int:
    """A port on ``host`` where rank 0's rendezvous store already listens: the OS picks it as the store binds, so no
    other process can take it between the choice and the rendezvous (as one can after ``find_free_port``).
    ``create_process_group`` for rank 0 in this process takes that store. A store not taken within ``hold_s``
    seconds (its set-up failed before rank 0 joined) is closed at the next reservation, freeing its port."""
    now = time.monotonic()
    for key in [k for k, (_, until) in _RESERVED.items() if until <= now]:
        del _RESERVED[key]  # the last reference: the store stops listening
    store = dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False)
    _RESERVED[(host, store.port)] = store, now + hold_s
    return int(store.port)


def default_backend() -> str:
    """ "nccl" when this process sees a CUDA device and NCCL is built in, else "gloo"."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def backend_device(backend: str) -> torch.device:
    """Where the transport buffers live: NCCL moves CUDA tensors, gloo moves host tensors, and ``local`` copies on
    the process's device (its roles' ``trainer.device=auto``)."""
    if backend == "nccl" or (backend == LOCAL and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Deadline:
    """An absolute point in time (``time.monotonic`` seconds) that each collective of one sync must meet."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.end = time.monotonic() + self.seconds

    def remaining(self) -> timedelta:
        return timedelta(seconds=max(0.001, self.end - time.monotonic()))

    def expired(self, slack_s: float = 0.05) -> bool:
        return time.monotonic() >= self.end - slack_s


def create_process_group(
    backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float, group_name: str
) -> tuple[dist.ProcessGroup, dist.Store]:
    """Rendezvous through a TCPStore that rank 0 hosts on ``host:port`` and return (process group, store).

    Blocks until all ``world_size`` ranks joined, at most ``timeout_s`` seconds (then c10d raises RuntimeError).
    Keep the store referenced as long as the group lives: rank 0's store is the server the others talk to (the one
    ``reserve_port`` started, where it chose ``port``).
    """
    reserved = _RESERVED.pop((host, port), (None, 0.0))[0] if rank == 0 else None
    if backend == LOCAL:
        from asyncrl.comm.local import join_local

        return join_local((host, port, group_name), rank, world_size), None
    timeout = timedelta(seconds=timeout_s)
    if reserved is not None:
        reserved.set_timeout(timeout)
        base = reserved
    else:
        base = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False)
    store = dist.PrefixStore(f"asyncrl/{group_name}/", base)
    if backend == "gloo":
        gloo = dist.ProcessGroupGloo
        opts = gloo._Options()
        opts._timeout = timeout
        # On one machine bind gloo to loopback; otherwise let gloo pick the interface (GLOO_SOCKET_IFNAME overrides).
        loopback = host.startswith("127.") or host == "localhost"
        opts._devices = [gloo.create_device(hostname=LOOPBACK) if loopback else gloo.create_default_device()]
        pg = gloo(store, rank, world_size, opts)
    elif backend == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError("weight sync: backend 'nccl' requested but this torch has no NCCL")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    else:
        raise ValueError(f"weight sync: unknown backend {backend!r} (expected 'gloo', 'nccl' or 'local')")
    return pg, base


def start_broadcast(pg: dist.ProcessGroup, tensor: torch.Tensor, deadline: Deadline) -> dist.Work:
    """Start broadcasting ``tensor`` in place from rank 0; the op itself gives up at the deadline."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    opts.timeout = deadline.remaining()
    return pg.broadcast([tensor], opts)


def wait(work: dist.Work, deadline: Deadline) -> None:
    """Wait for ``work`` until the deadline (RuntimeError from c10d when it passes)."""
    work.wait(deadline.remaining())


def broadcast(pg: dist.ProcessGroup, tensor: torch.Tensor, deadline: Deadline) -> None:
    wait(start_broadcast(pg, tensor, deadline), deadline)


def allreduce_sum(pg: dist.ProcessGroup, tensor: torch.Tensor, deadline: Deadline) -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.timeout = deadline.remaining()
    wait(pg.allreduce([tensor], opts), deadline)


def broadcast_bytes(pg: dist.ProcessGroup, payload: bytes | None, device: torch.device, deadline: Deadline) -> bytes:
    """Broadcast a byte string from rank 0 (``payload`` there, None elsewhere): length first, then the bytes."""
    length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64, device=device)
    broadcast(pg, length, deadline)
    if payload is not None:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    broadcast(pg, data, deadline)
    return bytes(data.cpu().numpy().tobytes())


def close_process_group(pg: dist.ProcessGroup | None, abort: bool) -> None:
    """Release the group's connections; ``abort`` after a failure (peers may be gone or out of step)."""
    if pg is None:
        return
    try:
        pg.abort() if abort else pg.shutdown()
    except Exception:  # noqa: BLE001 - best effort: the group is being dropped either way
        pass
